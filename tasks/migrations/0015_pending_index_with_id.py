"""claim_next's queue index ends with id, so ORDER BY created_at, id LIMIT 1 reads
the first entry instead of sorting the tenant's whole pending queue."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0008_agentkey_expiry"),
        ("tasks", "0014_purge_retention_records"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="task", name="tasks_task_pending_idx"),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("state", "pending")),
                fields=["tenant", "created_at", "id"],
                name="tasks_task_pending_idx",
            ),
        ),
    ]
