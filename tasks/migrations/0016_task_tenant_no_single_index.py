"""Drop ``tasks_task(tenant_id)``: every index of the table leads with tenant_id,
and each state change adds an entry to every index."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0008_agentkey_expiry"),
        ("tasks", "0015_pending_index_with_id"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    sql="DROP INDEX IF EXISTS tasks_task_tenant_id_1330d17c",
                    reverse_sql=(
                        "CREATE INDEX IF NOT EXISTS tasks_task_tenant_id_1330d17c"
                        " ON tasks_task (tenant_id)"
                    ),
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="task",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        to="portal.tenant",
                    ),
                ),
            ],
        )
    ]
