"""Composite keys and row-level security for the limits (docs/limits.md).

Every limit points at its agent, and every usage row at its limit, by
``(tenant_id, …)`` (docs/architecture.md, invariant 1); a usage row goes with its
limit. Each table gets the scope policy every tenant-owned table has (tasks migration
0017).
"""

from __future__ import annotations

from django.db import migrations

TABLES = ("limits_ratelimit", "limits_budget", "limits_limitusage")

FORWARD = """
ALTER TABLE limits_ratelimit ADD CONSTRAINT limits_ratelimit_agent_same_tenant_fk
    FOREIGN KEY (tenant_id, agent_id) REFERENCES portal_agent (tenant_id, id);
ALTER TABLE limits_budget ADD CONSTRAINT limits_budget_agent_same_tenant_fk
    FOREIGN KEY (tenant_id, agent_id) REFERENCES portal_agent (tenant_id, id);
ALTER TABLE limits_limitusage ADD CONSTRAINT limits_limitusage_rate_limit_same_tenant_fk
    FOREIGN KEY (tenant_id, rate_limit_id) REFERENCES limits_ratelimit (tenant_id, id)
    ON DELETE CASCADE;
ALTER TABLE limits_limitusage ADD CONSTRAINT limits_limitusage_budget_same_tenant_fk
    FOREIGN KEY (tenant_id, budget_id) REFERENCES limits_budget (tenant_id, id)
    ON DELETE CASCADE;
""" + "".join(
    f"""
ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
CREATE POLICY {table}_tenant_scope ON {table}
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
"""
    for table in TABLES
)

REVERSE = (
    "".join(
        f"""
DROP POLICY {table}_tenant_scope ON {table};
ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY;
ALTER TABLE {table} DISABLE ROW LEVEL SECURITY;
"""
        for table in TABLES
    )
    + """
ALTER TABLE limits_limitusage DROP CONSTRAINT limits_limitusage_budget_same_tenant_fk;
ALTER TABLE limits_limitusage DROP CONSTRAINT limits_limitusage_rate_limit_same_tenant_fk;
ALTER TABLE limits_budget DROP CONSTRAINT limits_budget_agent_same_tenant_fk;
ALTER TABLE limits_ratelimit DROP CONSTRAINT limits_ratelimit_agent_same_tenant_fk;
"""
)


class Migration(migrations.Migration):
    dependencies = [
        ("limits", "0001_initial"),
        ("tasks", "0017_row_level_security_everywhere"),  # portal_tenant_scope()
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
