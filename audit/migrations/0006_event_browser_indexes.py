"""Indexes for the event browser: newest first, a time range, trace id search, and
the code, actor and reason filters (each newest first, so a page is an index range).

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
                fields=["tenant", "code", "created_at", "id"],
                name="audit_event_code_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(
                fields=["tenant", "actor_type", "actor_id", "created_at", "id"],
                name="audit_event_actor_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(
                fields=["tenant", "reason_code", "created_at", "id"],
                condition=models.Q(reason_code__isnull=False),
                name="audit_event_reason_idx",
            ),
        ),
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
