"""The outbox key is the event id: a CHECK says so, and its unique index goes.

Every writer sets ``key`` to the event id (``audit/services.py``, the scale loader),
and ``audit_outbox_event_uniq`` (tenant_id, event_id) is unique: with
``audit_outbox_key_is_event_check`` (``key = event_id::varchar``) the consumers'
dedupe key is unique per tenant without ``audit_outbox_key_uniq``, whose index every
append and every ``sent`` mark paid for. Nothing read it: the outbox admin's search
(``=key``) compares ``UPPER(key)``, which that index cannot serve; it now looks the
event id up (``console/admin/trail.py``, through ``audit_outbox_event_uniq``).
docs/performance.md, "Every index pays for a query".

The CHECK is added ``NOT VALID`` and then validated: the validation reads the table
under a lock that lets writes go on (ADD CONSTRAINT alone would block them while it
scans).
"""

from __future__ import annotations

import django.db.models.functions.comparison
from django.db import migrations, models

# Three statements, each its own transaction (``atomic = False``): the drop and the
# NOT VALID add take their lock for a moment; the validation scans without blocking
# writes.
FORWARD = (
    "ALTER TABLE audit_outbox DROP CONSTRAINT audit_outbox_key_uniq",
    "ALTER TABLE audit_outbox ADD CONSTRAINT audit_outbox_key_is_event_check"
    ' CHECK ("key" = ("event_id")::varchar) NOT VALID',
    "ALTER TABLE audit_outbox VALIDATE CONSTRAINT audit_outbox_key_is_event_check",
)
REVERSE = (
    "ALTER TABLE audit_outbox ADD CONSTRAINT audit_outbox_key_uniq"
    " UNIQUE (tenant_id, key)",
    "ALTER TABLE audit_outbox DROP CONSTRAINT audit_outbox_key_is_event_check",
    migrations.RunSQL.noop,
)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("audit", "0029_outbox_lease_column")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(forward, reverse)
                for forward, reverse in zip(FORWARD, REVERSE, strict=True)
            ],
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="outbox", name="audit_outbox_key_uniq"
                ),
                migrations.AddConstraint(
                    model_name="outbox",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "key",
                                django.db.models.functions.comparison.Cast(
                                    "event_id", models.CharField()
                                ),
                            )
                        ),
                        name="audit_outbox_key_is_event_check",
                    ),
                ),
            ],
        )
    ]
