"""The task and operation states checked by domains, not by table CHECKs.

A table CHECK is parsed again by every statement that writes the table; a domain's
once per session (portal/domains.py). The CHECKs keep their names
(``tasks_task_state_check``, ``tasks_operation_state_check``). The domains are made
without their checks first, so the columns change type without a rewrite of the
tables; the checks are then added and validated (one scan each).
"""

from __future__ import annotations

from django.db import migrations

import portal.domains
from portal.domains import domain_values_for_column_sql

# Frozen copies of TaskState and OperationState (R7; tests/db/test_constraints.py).
TASK_STATES = (
    "pending",
    "running",
    "waiting",
    "human_required",
    "human_claimed",
    "succeeded",
    "failed",
    "cancelled",
)
OPERATION_STATES = (
    "reserved",
    "executing",
    "verified",
    "failed",
    "unknown",
    "conflict",
    "human_required",
)

TASK_DOMAIN, TASK_CHECK = domain_values_for_column_sql(
    "tasks_task_state", "tasks_task_state_check", "varchar(20)", TASK_STATES
)
OPERATION_DOMAIN, OPERATION_CHECK = domain_values_for_column_sql(
    "tasks_operation_state",
    "tasks_operation_state_check",
    "varchar(20)",
    OPERATION_STATES,
)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0023_reason_and_event_code_domains"),
    ]

    operations = [
        migrations.RunSQL(*TASK_DOMAIN),
        migrations.RunSQL(*OPERATION_DOMAIN),
        migrations.RemoveConstraint(
            model_name="operation",
            name="tasks_operation_state_check",
        ),
        migrations.RemoveConstraint(
            model_name="task",
            name="tasks_task_state_check",
        ),
        migrations.AlterField(
            model_name="operation",
            name="state",
            field=portal.domains.DomainCharField(
                choices=[
                    ("reserved", "Reserved"),
                    ("executing", "Executing"),
                    ("verified", "Verified"),
                    ("failed", "Failed"),
                    ("unknown", "Unknown"),
                    ("conflict", "Conflict"),
                    ("human_required", "Human Required"),
                ],
                default="reserved",
                domain="tasks_operation_state",
                max_length=20,
            ),
        ),
        migrations.AlterField(
            model_name="task",
            name="state",
            field=portal.domains.DomainCharField(
                choices=[
                    ("pending", "Pending"),
                    ("running", "Running"),
                    ("waiting", "Waiting"),
                    ("human_required", "Human Required"),
                    ("human_claimed", "Human Claimed"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                ],
                default="pending",
                domain="tasks_task_state",
                max_length=20,
            ),
        ),
        migrations.RunSQL(*TASK_CHECK),
        migrations.RunSQL(*OPERATION_CHECK),
    ]
