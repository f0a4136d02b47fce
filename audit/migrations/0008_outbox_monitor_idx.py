"""The two indexes the outbox monitor reads (console/admin/trail.py).

``audit_outbox_unsent_state_idx`` holds only pending and dead rows (few), so their
counts per tenant and the oldest pending row are index-only reads.
``audit_outbox_sent_idx`` serves "sent in the last hour" and the delivery lag of the
last N sent rows, a backward range per tenant; a full count of sent rows is never
taken. Both are built ``CONCURRENTLY`` (so the migration is not atomic): the outbox
is written on every state change and writers must not wait for the build.
"""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("audit", "0007_outbox_dismissed")]

    operations = [
        AddIndexConcurrently(
            model_name="outbox",
            index=models.Index(
                condition=models.Q(state__in=["pending", "dead"]),
                fields=["tenant", "state", "created_at"],
                name="audit_outbox_unsent_state_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="outbox",
            index=models.Index(
                condition=models.Q(state="sent"),
                fields=["tenant", "sent_at"],
                include=("created_at",),
                name="audit_outbox_sent_idx",
            ),
        ),
    ]
