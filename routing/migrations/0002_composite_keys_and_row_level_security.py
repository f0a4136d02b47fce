"""What Django cannot say about routing's tables: every reference to a group stays
inside its tenant (composite foreign keys, invariant 1), row-level security with the
scope policy on every table (tasks/0017), and the one discovery function the beat
jobs ask which tenants have due SLA deadlines or notifications (docs/routing.md).
"""

from __future__ import annotations

from django.db import migrations

DISCOVERY_ROLE = "portal_discovery"

TABLES = (
    "routing_group",
    "routing_groupmember",
    "routing_routingrule",
    "routing_webhook",
    "routing_assignment",
    "routing_notification",
)

# (constraint, child table, child column) -> routing_group (tenant_id, id)
GROUP_REFERENCES = (
    ("routing_groupmember_group_same_tenant_fk", "routing_groupmember", "group_id"),
    ("routing_routingrule_group_same_tenant_fk", "routing_routingrule", "group_id"),
    (
        "routing_routingrule_backup_same_tenant_fk",
        "routing_routingrule",
        "backup_group_id",
    ),
    ("routing_assignment_group_same_tenant_fk", "routing_assignment", "group_id"),
)

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

FORWARD = "".join(
    f"ALTER TABLE {table} ADD CONSTRAINT {name}\n"
    f"    FOREIGN KEY (tenant_id, {column}) REFERENCES routing_group (tenant_id, id);\n"
    for name, table, column in GROUP_REFERENCES
) + "".join(POLICY.format(table=table) for table in TABLES)

REVERSE = "".join(NO_POLICY.format(table=table) for table in TABLES) + "".join(
    f"ALTER TABLE {table} DROP CONSTRAINT {name};\n"
    for name, table, _ in GROUP_REFERENCES
)

# Which tenants have an open item past a deadline, or a notification due: tenant
# ids only, as every discovery function (tasks/0017).
DISCOVERY = f"""
GRANT CREATE ON SCHEMA public TO {DISCOVERY_ROLE};
GRANT SELECT (tenant_id, remind_at, escalate_at, reminded_at, escalated_at, closed_at)
    ON routing_assignment TO {DISCOVERY_ROLE};
GRANT SELECT (tenant_id, state, available_at) ON routing_notification
    TO {DISCOVERY_ROLE};
CREATE FUNCTION routing_tenants_with_due_work() RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT a.tenant_id FROM routing_assignment a
    WHERE a.closed_at IS NULL AND (
        (a.reminded_at IS NULL AND a.remind_at <= app_now())
        OR (a.escalated_at IS NULL AND a.escalate_at <= app_now()))
    UNION
    SELECT n.tenant_id FROM routing_notification n
    WHERE n.state = 'pending' AND n.available_at <= app_now()
$$;
REVOKE ALL ON FUNCTION routing_tenants_with_due_work() FROM PUBLIC;
ALTER FUNCTION routing_tenants_with_due_work() OWNER TO {DISCOVERY_ROLE};
REVOKE CREATE ON SCHEMA public FROM {DISCOVERY_ROLE};
"""

NO_DISCOVERY = f"""
DROP FUNCTION routing_tenants_with_due_work();
REVOKE SELECT (tenant_id, remind_at, escalate_at, reminded_at, escalated_at, closed_at)
    ON routing_assignment FROM {DISCOVERY_ROLE};
REVOKE SELECT (tenant_id, state, available_at) ON routing_notification
    FROM {DISCOVERY_ROLE};
"""


class Migration(migrations.Migration):
    dependencies = [("routing", "0001_initial")]

    operations = [
        migrations.RunSQL(FORWARD, REVERSE),
        migrations.RunSQL(DISCOVERY, NO_DISCOVERY),
    ]
