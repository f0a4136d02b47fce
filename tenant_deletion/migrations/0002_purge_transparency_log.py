"""The tenant purge deletes the transparency log too (audit migration 0021).

``tenant_deletion_purge`` (migration 0001) gets ``audit_logentry`` and
``audit_treehead`` in its list of trail tables: under ``purge`` a tenant's log
leaves and signed tree heads go with its events, before the tenant row; under
``keep`` they stay with the events. Nothing else changes; the reverse restores
0001's function.
"""

from __future__ import annotations

from django.db import migrations

SEARCH_PATH = "pg_catalog, public, pg_temp"  # as in migration 0001

FORWARD = f"""
CREATE OR REPLACE FUNCTION tenant_deletion_purge(p_tenant uuid)
RETURNS TABLE (relation text, deleted bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {SEARCH_PATH} AS $$
DECLARE
    v_policy text;
    v_deleted_at timestamptz;
    v_table text;
BEGIN
    -- FORCE row-level security binds the owner too: without the tenant in the
    -- caller's scope, "no tasks left" would be blind.
    IF p_tenant IS NULL OR NOT p_tenant = ANY (
        coalesce(public.portal_tenant_scope(), '{{}}'::uuid[])
    ) THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % is not in scope', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The decision comes from the locked row; only the owner and the operator may
    -- update these two columns.
    SELECT t.events_on_delete, t.deleted_at INTO v_policy, v_deleted_at
    FROM public.portal_tenant t WHERE t.id = p_tenant FOR UPDATE;
    IF NOT FOUND OR v_deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % is gone or deleted', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT 1 FROM public.tasks_task t WHERE t.tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % still has tasks', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    relation := 'tasks_contract';
    DELETE FROM public.tasks_contract c WHERE c.tenant_id = p_tenant;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
    IF v_policy <> 'purge' THEN
        UPDATE public.portal_tenant SET deleted_at = public.app_now()
        WHERE id = p_tenant;
        RETURN;
    END IF;
    -- The trail and what vouches for it, then the tenant row itself: a tenant
    -- row that any other table still references stops the whole deletion.
    FOREACH v_table IN ARRAY ARRAY[
        'audit_event', 'audit_checkpoint', 'audit_retentionanchor',
        'audit_retentionpurge', 'audit_chainhead', 'audit_logentry',
        'audit_treehead', 'portal_tenant'
    ] LOOP
        relation := v_table;
        EXECUTE format(
            'DELETE FROM public.%I WHERE %I = $1', v_table,
            CASE v_table WHEN 'portal_tenant' THEN 'id' ELSE 'tenant_id' END
        ) USING p_tenant;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        RETURN NEXT;
    END LOOP;
END $$;
"""

REVERSE = f"""
CREATE OR REPLACE FUNCTION tenant_deletion_purge(p_tenant uuid)
RETURNS TABLE (relation text, deleted bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {SEARCH_PATH} AS $$
DECLARE
    v_policy text;
    v_deleted_at timestamptz;
    v_table text;
BEGIN
    -- FORCE row-level security binds the owner too: without the tenant in the
    -- caller's scope, "no tasks left" would be blind.
    IF p_tenant IS NULL OR NOT p_tenant = ANY (
        coalesce(public.portal_tenant_scope(), '{{}}'::uuid[])
    ) THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % is not in scope', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The decision comes from the locked row; only the owner and the operator may
    -- update these two columns.
    SELECT t.events_on_delete, t.deleted_at INTO v_policy, v_deleted_at
    FROM public.portal_tenant t WHERE t.id = p_tenant FOR UPDATE;
    IF NOT FOUND OR v_deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % is gone or deleted', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT 1 FROM public.tasks_task t WHERE t.tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % still has tasks', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    relation := 'tasks_contract';
    DELETE FROM public.tasks_contract c WHERE c.tenant_id = p_tenant;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
    IF v_policy <> 'purge' THEN
        UPDATE public.portal_tenant SET deleted_at = public.app_now()
        WHERE id = p_tenant;
        RETURN;
    END IF;
    -- The trail and what vouches for it, then the tenant row itself: a tenant
    -- row that any other table still references stops the whole deletion.
    FOREACH v_table IN ARRAY ARRAY[
        'audit_event', 'audit_checkpoint', 'audit_retentionanchor',
        'audit_retentionpurge', 'audit_chainhead', 'portal_tenant'
    ] LOOP
        relation := v_table;
        EXECUTE format(
            'DELETE FROM public.%I WHERE %I = $1', v_table,
            CASE v_table WHEN 'portal_tenant' THEN 'id' ELSE 'tenant_id' END
        ) USING p_tenant;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        RETURN NEXT;
    END LOOP;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("tenant_deletion", "0001_operator_purge"),
        ("audit", "0021_transparency_log"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
