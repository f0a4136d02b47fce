"""Indexes for the admin's exact task searches by trace id and object id.

Built CONCURRENTLY so registration and claims keep writing during the build.
"""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("tasks", "0007_queued_execution")]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                fields=["tenant", "trace_id"], name="tasks_task_trace_idx"
            ),
        ),
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                fields=["tenant", "object_id"], name="tasks_task_object_idx"
            ),
        ),
    ]
