"""Composite foreign keys for escalations and approvals (invariant 1)."""

from __future__ import annotations

from django.db import migrations

FORWARD = """
ALTER TABLE tasks_escalation ADD CONSTRAINT tasks_escalation_task_same_tenant_fk
    FOREIGN KEY (tenant_id, task_id) REFERENCES tasks_task (tenant_id, id);
ALTER TABLE tasks_escalation ADD CONSTRAINT tasks_escalation_operation_same_tenant_fk
    FOREIGN KEY (tenant_id, operation_id) REFERENCES tasks_operation (tenant_id, id);
CREATE INDEX tasks_escalation_operation_idx ON tasks_escalation (tenant_id, operation_id);
ALTER TABLE tasks_approval ADD CONSTRAINT tasks_approval_operation_same_tenant_fk
    FOREIGN KEY (tenant_id, operation_id) REFERENCES tasks_operation (tenant_id, id);
CREATE INDEX tasks_approval_operation_idx ON tasks_approval (tenant_id, operation_id);
"""

REVERSE = """
DROP INDEX tasks_approval_operation_idx;
ALTER TABLE tasks_approval DROP CONSTRAINT tasks_approval_operation_same_tenant_fk;
DROP INDEX tasks_escalation_operation_idx;
ALTER TABLE tasks_escalation DROP CONSTRAINT tasks_escalation_operation_same_tenant_fk;
ALTER TABLE tasks_escalation DROP CONSTRAINT tasks_escalation_task_same_tenant_fk;
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0003_gateway")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
