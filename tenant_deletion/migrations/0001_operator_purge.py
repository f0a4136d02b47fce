"""The tenant purge becomes the operator's, and every definer function ends its
``search_path`` with ``pg_temp`` (issue 19 §1).

Before, ``tasks_purge_tenant_rows`` (tasks migrations 0011, 0014, 0017) was the app
role's, and trusted only what the app role itself can write: its scope, "the tenant
has no tasks" and ``portal_tenant.events_on_delete``. The app role could set a live
tenant's policy to ``purge``, delete its tasks, erase its events and checkpoints and
set the policy back. Now:

- ``tasks_purge_tenant_rows`` is gone. ``tenant_deletion_purge(tenant)`` takes its
  place, owned by the owner, executable by ``portal_operator`` alone (the role
  ``manage.py delete_tenant`` connects as), never by the app role. It takes its
  decision from the locked tenant row, whose ``events_on_delete`` and ``deleted_at``
  the app role can no longer update (``APP_GRANTS``). It deletes the tenant's
  published contracts; then, under ``purge``, the trail (events, checkpoints,
  retention's records and anchors, the chains' head rows) **and the tenant row in
  the same call**, so a trail never goes while its tenant lives; under ``keep`` it
  marks the tenant row deleted. It refuses a tenant outside the caller's scope, one
  already deleted, and one that still has tasks.
- A definer function whose ``search_path`` does not name ``pg_temp`` searches the
  caller's temporary schema *first* for tables: a caller's ``CREATE TEMP TABLE
  portal_membership`` shadowed the real one in ``portal_person_tenants``. Every
  ``SECURITY DEFINER`` function in ``public`` now ends its ``search_path`` with
  ``pg_temp``, appended to what it listed (``pg_catalog, public, pg_temp``;
  retention's ``public, pg_temp`` had it already, and must keep ``public`` first:
  their ``CREATE TABLE`` goes to the first schema); the owner may alter the
  discovery role's functions, being its member.
"""

from __future__ import annotations

from django.db import migrations

OPERATOR_ROLE = "portal_operator"  # portal.db_roles.OPERATOR_ROLE (tests check it)
SEARCH_PATH = "pg_catalog, public, pg_temp"

# Appends pg_temp to each definer function's own search_path, whatever it lists
# before (retention's start with public: their CREATE TABLE goes to the first one);
# one without a search_path gets the default below.
PG_TEMP_LAST = f"""
DO $pg_temp$
DECLARE
    v_function record;
BEGIN
    FOR v_function IN
        SELECT p.oid::regprocedure AS signature, (
            SELECT substr(c.setting, length('search_path=') + 1)
            FROM unnest(p.proconfig) AS c(setting)
            WHERE c.setting LIKE 'search_path=%'
        ) AS search_path
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.prosecdef
    LOOP
        CONTINUE WHEN right(v_function.search_path, 7) = 'pg_temp';
        EXECUTE format(
            'ALTER FUNCTION %s SET search_path = %s', v_function.signature,
            coalesce(v_function.search_path || ', pg_temp', '{SEARCH_PATH}')
        );
    END LOOP;
END $pg_temp$;
"""

FORWARD = (
    f"""
DO $operator$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{OPERATOR_ROLE}') THEN
        RAISE EXCEPTION 'role {OPERATOR_ROLE} is missing'
            USING HINT = 'portal.db_roles.ensure_roles makes it (manage.py up and '
                         'the test suite call it; README, "Database roles")';
    END IF;
END $operator$;

DROP FUNCTION tasks_purge_tenant_rows(regclass, uuid);

CREATE FUNCTION tenant_deletion_purge(p_tenant uuid)
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
REVOKE EXECUTE ON FUNCTION tenant_deletion_purge(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tenant_deletion_purge(uuid) TO {OPERATOR_ROLE};
"""
    + PG_TEMP_LAST
)

# tasks migration 0017's function, for the app role again (APP_GRANTS of before).
# The search paths keep pg_temp: it is safe for the older code too.
REVERSE = """
DROP FUNCTION tenant_deletion_purge(uuid);
CREATE FUNCTION tasks_purge_tenant_rows(p_table regclass, p_tenant uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
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
    IF p_tenant IS NULL OR NOT p_tenant = ANY (
        coalesce(public.portal_tenant_scope(), '{}'::uuid[])
    ) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: tenant % is not in scope', p_tenant
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
"""


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("portal", "0008_agentkey_expiry"),
        ("tasks", "0017_row_level_security_everywhere"),
        ("audit", "0017_chain_link_in_append"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
