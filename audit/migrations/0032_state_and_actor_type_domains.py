"""The actor type and the outbox state checked by domains, and the id-time CHECK
through one PL/pgSQL call instead of an inlined SQL function.

A table CHECK is parsed again by every statement that writes the table (its stored
text, ``stringToNode``) and planned again; a domain's CHECK once per session
(portal/domains.py). The CHECKs keep their names. The domains are made without
their checks first, so the columns change type without rewriting ``audit_event``;
the checks are then added and validated (one scan each).

``audit_event_id_time_check`` (migration 0011) called ``audit_uuid7_time`` twice, an
SQL function that PostgreSQL inlines, so each statement re-planned the function's
body twice; the same test in a PL/pgSQL function, whose expression is planned once
per session, cost a fifth of it (bench/value_checks.py, docs/performance.md). The
function is STABLE, not IMMUTABLE: ``timestamptz - interval`` depends on TimeZone.
"""

from __future__ import annotations

import importlib

from django.db import migrations

import portal.domains
from portal.domains import domain_values_for_column_sql

# Frozen copies of ActorType and OutboxState (R7; tests/db/test_constraints.py).
ACTOR_TYPES = ("agent", "user", "system")
OUTBOX_STATES = ("pending", "sent", "dead", "dismissed")

ACTOR_DOMAIN, ACTOR_CHECK = domain_values_for_column_sql(
    "audit_event_actor_type", "audit_event_actor_type_check", "varchar(10)", ACTOR_TYPES
)
OUTBOX_DOMAIN, OUTBOX_CHECK = domain_values_for_column_sql(
    "audit_outbox_state", "audit_outbox_state_check", "varchar(10)", OUTBOX_STATES
)

_partitions = importlib.import_module("audit.migrations.0011_event_partitions")
ID_TIME_TOLERANCE: str = _partitions.ID_TIME_TOLERANCE

ID_TIME_FORWARD = f"""
CREATE FUNCTION audit_event_id_time_ok(
    p_id uuid, p_created_at timestamptz, p_tolerance interval
) RETURNS boolean
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
DECLARE
    v_at timestamptz := audit_uuid7_time(p_id);
BEGIN
    RETURN p_created_at > v_at - p_tolerance AND p_created_at < v_at + p_tolerance;
END $$;
COMMENT ON FUNCTION audit_event_id_time_ok(uuid, timestamptz, interval) IS
    'audit_event_id_time_check: created_at within p_tolerance of the UUIDv7 id''s time.';
ALTER TABLE audit_event DROP CONSTRAINT audit_event_id_time_check;
ALTER TABLE audit_event ADD CONSTRAINT audit_event_id_time_check
    CHECK (audit_event_id_time_ok(id, created_at, interval '{ID_TIME_TOLERANCE}'))
    NOT VALID;
ALTER TABLE audit_event VALIDATE CONSTRAINT audit_event_id_time_check;
"""
ID_TIME_REVERSE = f"""
ALTER TABLE audit_event DROP CONSTRAINT audit_event_id_time_check;
{_partitions.ID_TIME_CHECK}
ALTER TABLE audit_event VALIDATE CONSTRAINT audit_event_id_time_check;
DROP FUNCTION audit_event_id_time_ok(uuid, timestamptz, interval);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0031_tenant_created_event_code"),
    ]

    operations = [
        migrations.RunSQL(*ACTOR_DOMAIN),
        migrations.RunSQL(*OUTBOX_DOMAIN),
        migrations.RemoveConstraint(
            model_name="event",
            name="audit_event_actor_type_check",
        ),
        migrations.RemoveConstraint(
            model_name="outbox",
            name="audit_outbox_state_check",
        ),
        migrations.AlterField(
            model_name="event",
            name="actor_type",
            field=portal.domains.DomainCharField(
                choices=[("agent", "Agent"), ("user", "User"), ("system", "System")],
                domain="audit_event_actor_type",
                max_length=10,
            ),
        ),
        migrations.AlterField(
            model_name="outbox",
            name="state",
            field=portal.domains.DomainCharField(
                choices=[
                    ("pending", "Pending"),
                    ("sent", "Sent"),
                    ("dead", "Dead"),
                    ("dismissed", "Dismissed"),
                ],
                default="pending",
                domain="audit_outbox_state",
                max_length=10,
            ),
        ),
        migrations.RunSQL(*ACTOR_CHECK),
        migrations.RunSQL(*OUTBOX_CHECK),
        migrations.RunSQL(ID_TIME_FORWARD, ID_TIME_REVERSE),
    ]
