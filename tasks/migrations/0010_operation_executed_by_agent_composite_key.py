"""The executing agent belongs to the operation's tenant (invariant 1)."""

from __future__ import annotations

from django.db import migrations

FORWARD = """
ALTER TABLE tasks_operation ADD CONSTRAINT tasks_operation_executed_by_agent_same_tenant_fk
    FOREIGN KEY (tenant_id, executed_by_agent_id)
    REFERENCES portal_agent (tenant_id, id);
CREATE INDEX tasks_operation_executed_by_idx
    ON tasks_operation (tenant_id, executed_by_agent_id)
    WHERE executed_by_agent_id IS NOT NULL;
"""

REVERSE = """
DROP INDEX tasks_operation_executed_by_idx;
ALTER TABLE tasks_operation DROP CONSTRAINT tasks_operation_executed_by_agent_same_tenant_fk;
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0009_operation_executed_by_agent")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
