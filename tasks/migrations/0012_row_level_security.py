"""Row-level security on the first tenant-owned tables (docs/database-roles.md).

Each table gets ``ENABLE`` and ``FORCE ROW LEVEL SECURITY`` (the owner is bound too,
so the owner's definer functions see only the caller's tenants) and one policy:
``tenant_id`` must be in the transaction-local ``portal.tenant_ids`` setting that
``portal/scope.py`` sets per request, job and command. Unset, it matches nothing.
``(SELECT portal_tenant_scope())`` is evaluated once per statement (an InitPlan),
not per row, and ``tenant_id = ANY (…)`` can use the tenant indexes.

The tables that work spanning tenants reads (tasks, operations, events, outbox,
checkpoints, idempotency records) and the ones log-in looks up across tenants
(agents, keys, memberships) come with the narrow cross-tenant mechanism; until then
they are listed in ``tests/db/test_row_level_security.py``'s ``PENDING``.
"""

from __future__ import annotations

from django.db import migrations

TABLES = (
    "portal_agentgrant",
    "tasks_approval",
    "tasks_connector",
    "tasks_contract",
    "tasks_credential",
    "tasks_escalation",
    "tasks_objectversion",
)

SCOPE_FUNCTION = """
CREATE FUNCTION portal_tenant_scope() RETURNS uuid[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT string_to_array(
        NULLIF(current_setting('portal.tenant_ids', true), ''), ','
    )::uuid[]
$$;
"""

POLICY = """
ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
CREATE POLICY {table}_tenant_scope ON {table}
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
"""

NO_POLICY = """
DROP POLICY {table}_tenant_scope ON {table};
ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY;
ALTER TABLE {table} DISABLE ROW LEVEL SECURITY;
"""

FORWARD = SCOPE_FUNCTION + "".join(POLICY.format(table=t) for t in TABLES)
REVERSE = "".join(NO_POLICY.format(table=t) for t in TABLES) + (
    "DROP FUNCTION portal_tenant_scope();"
)


class Migration(migrations.Migration):
    dependencies = [("tasks", "0011_owner_only_purge")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
