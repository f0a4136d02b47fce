"""Purge through the owner's function alone; operations never truncated.

Deleting a published contract version, an event or a checkpoint is the tenant
purge's privilege (tenant_deletion/services.py). It was a setting any session could
set (``portal.purge``); now it is ``tasks_purge_tenant_rows``, a ``SECURITY DEFINER``
function owned by the schema owner, whose ``EXECUTE`` only the app role is granted
(portal/db_roles.py), and which deletes only what a tenant deletion deletes: one of
the three guarded tables, one tenant, once that tenant's tasks are gone, and events
and checkpoints only under the tenant's ``purge`` policy. The triggers let a row go
only when the current user owns the table, as it does inside the function.
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION tasks_contract_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'draft' THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF portal_current_user_owns(TG_RELID) THEN
            RETURN OLD;
        END IF;
    ELSIF (NEW.tenant_id, NEW.key, NEW.version, NEW.spec, NEW.created_at,
           NEW.published_at)
          IS NOT DISTINCT FROM
          (OLD.tenant_id, OLD.key, OLD.version, OLD.spec, OLD.created_at,
           OLD.published_at)
      AND (NEW.status = OLD.status AND NEW.retired_at IS NOT DISTINCT FROM OLD.retired_at
           OR OLD.status = 'published' AND NEW.status = 'retired') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'contract % v%: published versions are immutable (% refused)',
            OLD.key, OLD.version, TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'tasks_contract_immutable_trg';
END $$;

CREATE FUNCTION tasks_purge_tenant_rows(p_table regclass, p_tenant uuid)
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
REVOKE EXECUTE ON FUNCTION tasks_purge_tenant_rows(regclass, uuid) FROM PUBLIC;

CREATE TRIGGER tasks_operation_truncate_trg BEFORE TRUNCATE ON tasks_operation
    FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();
"""

REVERSE = """
DROP TRIGGER tasks_operation_truncate_trg ON tasks_operation;
DROP FUNCTION tasks_purge_tenant_rows(regclass, uuid);
CREATE OR REPLACE FUNCTION tasks_contract_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'draft' THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF current_setting('portal.purge', true) = 'on' THEN
            RETURN OLD;
        END IF;
    ELSIF (NEW.tenant_id, NEW.key, NEW.version, NEW.spec, NEW.created_at,
           NEW.published_at)
          IS NOT DISTINCT FROM
          (OLD.tenant_id, OLD.key, OLD.version, OLD.spec, OLD.created_at,
           OLD.published_at)
      AND (NEW.status = OLD.status AND NEW.retired_at IS NOT DISTINCT FROM OLD.retired_at
           OR OLD.status = 'published' AND NEW.status = 'retired') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'contract % v%: published versions are immutable (% refused)',
            OLD.key, OLD.version, TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'tasks_contract_immutable_trg';
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0010_operation_executed_by_agent_composite_key"),
        ("audit", "0010_owner_only_purge"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
