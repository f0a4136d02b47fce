"""The tenant purge also removes retention's purge records and anchors.

They vouch for the events (docs/retention.md) and, like the checkpoints, go with them
when a tenant whose events are purged is deleted (tenant_deletion/services.py). Their
append-only trigger lets a row go only when the current user owns the table, as it
does inside ``tasks_purge_tenant_rows``, which now accepts the two tables under the
same rule as events and checkpoints (the tenant's ``purge`` policy).
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION tasks_purge_tenant_rows(p_table regclass, p_tenant uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    deleted bigint;
BEGIN
    IF p_table NOT IN ('public.tasks_contract'::regclass,
                       'public.audit_event'::regclass,
                       'public.audit_checkpoint'::regclass,
                       'public.audit_retentionpurge'::regclass,
                       'public.audit_retentionanchor'::regclass) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: % is not purged this way', p_table
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT 1 FROM public.tasks_task t WHERE t.tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: tenant % still has tasks', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_table <> 'public.tasks_contract'::regclass AND NOT EXISTS (
        SELECT 1 FROM public.portal_tenant t
        WHERE t.id = p_tenant AND t.events_on_delete = 'purge'
    ) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: tenant % keeps its events', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    EXECUTE format('DELETE FROM %s WHERE tenant_id = $1', p_table) USING p_tenant;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END $$;
"""

REVERSE = """
CREATE OR REPLACE FUNCTION tasks_purge_tenant_rows(p_table regclass, p_tenant uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    deleted bigint;
BEGIN
    IF p_table NOT IN ('public.tasks_contract'::regclass,
                       'public.audit_event'::regclass,
                       'public.audit_checkpoint'::regclass) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: % is not purged this way', p_table
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT 1 FROM public.tasks_task t WHERE t.tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: tenant % still has tasks', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_table <> 'public.tasks_contract'::regclass AND NOT EXISTS (
        SELECT 1 FROM public.portal_tenant t
        WHERE t.id = p_tenant AND t.events_on_delete = 'purge'
    ) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: tenant % keeps its events', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    EXECUTE format('DELETE FROM %s WHERE tenant_id = $1', p_table) USING p_tenant;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0013_operation_sealed_values"),
        ("audit", "0013_retention_functions"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
