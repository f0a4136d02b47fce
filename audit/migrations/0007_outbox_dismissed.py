"""The ``dismissed`` outbox state.

An operator gave up on a dead row (``outbox.dismissed`` event); the relay never claims
it and it no longer holds its task's later rows back (audit/relay.py). The CHECK is
swapped inside this migration's transaction, so no row is ever unchecked.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("audit", "0006_event_browser_indexes")]

    operations = [
        migrations.RemoveConstraint(
            model_name="outbox", name="audit_outbox_state_check"
        ),
        migrations.AlterField(
            model_name="outbox",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("sent", "Sent"),
                    ("dead", "Dead"),
                    ("dismissed", "Dismissed"),
                ],
                default="pending",
                max_length=10,
            ),
        ),
        migrations.AddConstraint(
            model_name="outbox",
            constraint=models.CheckConstraint(
                condition=models.Q(state__in=["pending", "sent", "dead", "dismissed"]),
                name="audit_outbox_state_check",
            ),
        ),
    ]
