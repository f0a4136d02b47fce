"""The reserving agent belongs to the operation's tenant (invariant 1)."""

from __future__ import annotations

from django.db import migrations

FORWARD = """
ALTER TABLE tasks_operation ADD CONSTRAINT tasks_operation_agent_same_tenant_fk
    FOREIGN KEY (tenant_id, agent_id) REFERENCES portal_agent (tenant_id, id);
CREATE INDEX tasks_operation_agent_idx ON tasks_operation (tenant_id, agent_id);
"""

REVERSE = """
DROP INDEX tasks_operation_agent_idx;
ALTER TABLE tasks_operation DROP CONSTRAINT tasks_operation_agent_same_tenant_fk;
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0005_operation_agent_and_call_fields")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
