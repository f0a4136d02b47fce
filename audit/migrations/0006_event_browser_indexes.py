"""Indexes for the event browser: newest first / a time range, and trace id search.

Built CONCURRENTLY: ``audit_event`` is the largest table and takes writes on every
state change, which a plain CREATE INDEX would block for the whole build.
"""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audit", "0005_people_event_codes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(
                fields=["tenant", "created_at", "id"], name="audit_event_created_idx"
            ),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(
                fields=["tenant", "trace_id"], name="audit_event_trace_idx"
            ),
        ),
    ]
