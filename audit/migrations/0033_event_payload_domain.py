"""The event payload's size bound checked by a domain, not by a table CHECK.

``audit_event_payload_size_check`` (migration 0002) becomes the CHECK of the
domain ``audit_event_payload`` over ``jsonb``, the payload column's type: the same
bound on every write, its expression parsed once per session instead of once per
statement (portal/domains.py; bench/value_checks.py measures both). The domain is
made without its check first, so ``audit_event`` is not rewritten; the check is
then added and validated (one scan).
"""

from __future__ import annotations

import importlib

from django.db import migrations

import portal.domains
from portal.domains import domain_for_column_sql

# The bound as migration 0002 copied it (tests/db/test_constraints.py checks it).
EVENT_PAYLOAD_MAX_BYTES: int = importlib.import_module(
    "audit.migrations.0002_invariants"
).EVENT_PAYLOAD_MAX_BYTES

DOMAIN, CHECK = domain_for_column_sql(
    "audit_event_payload",
    "audit_event_payload_size_check",
    "jsonb",
    f"octet_length(VALUE::text) <= {EVENT_PAYLOAD_MAX_BYTES}",
)
TABLE_CHECK = (
    "ALTER TABLE audit_event DROP CONSTRAINT audit_event_payload_size_check",
    (
        "ALTER TABLE audit_event ADD CONSTRAINT audit_event_payload_size_check"
        f" CHECK (octet_length(payload::text) <= {EVENT_PAYLOAD_MAX_BYTES}) NOT VALID",
        "ALTER TABLE audit_event VALIDATE CONSTRAINT audit_event_payload_size_check",
    ),
)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0032_state_and_actor_type_domains"),
    ]

    operations = [
        migrations.RunSQL(*DOMAIN),
        migrations.RunSQL(*TABLE_CHECK),
        migrations.AlterField(
            model_name="event",
            name="payload",
            field=portal.domains.DomainJSONField(
                default=dict, domain="audit_event_payload"
            ),
        ),
        migrations.RunSQL(*CHECK),
    ]
