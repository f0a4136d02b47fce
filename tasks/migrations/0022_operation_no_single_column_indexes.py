"""Drop ``tasks_operation``'s four single-column foreign-key indexes.

Django made them for ``tenant``, ``task``, ``agent`` and ``executed_by_agent``; the
real constraints are the composite ``(tenant_id, …)`` foreign keys, each with its
``(tenant_id, …)`` index, and every query of the table runs under row-level
security, which gives it the tenant: no plan uses the single-column ones, and each
costs every reservation and every change of an operation (docs/performance.md,
"Every index pays for a query", with the ``EXPLAIN`` of each lookup).
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

_INDEXES = {
    "tenant_id": "tasks_operation_tenant_id_28d1f91d",
    "task_id": "tasks_operation_task_id_b3b08258",
    "agent_id": "tasks_operation_agent_id_bb59e765",
    "executed_by_agent_id": "tasks_operation_executed_by_agent_id_aa177ad7",
}


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0010_agent_sponsor"),
        ("tasks", "0021_approval_quorum"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    sql=[f"DROP INDEX IF EXISTS {name}" for name in _INDEXES.values()],
                    reverse_sql=[
                        f"CREATE INDEX IF NOT EXISTS {name} ON tasks_operation ({column})"
                        for column, name in _INDEXES.items()
                    ],
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="operation",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        to="portal.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="operation",
                    name="task",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="operations",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="operation",
                    name="agent",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="portal.agent",
                    ),
                ),
                migrations.AlterField(
                    model_name="operation",
                    name="executed_by_agent",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="portal.agent",
                    ),
                ),
            ],
        )
    ]
