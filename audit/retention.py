"""Audit retention: partitions ahead, purges, payload drops (docs/retention.md).

The removing itself happens only in the owner's ``SECURITY DEFINER`` functions
(migration 0013); this module calls them, one transaction per tenant, and appends
the record of each removal through ``event_append``, in the same transaction:

- ``audit.purged`` (the tombstone) in the tenant's chain: the purge record's
  columns and the SHA-256 of its anchors (``verify.tombstone_data``), so
  ``verify_audit`` accepts the gap and sees a tampered tombstone or anchor;
- ``audit.payloads_dropped``: how many payloads went, up to which id.

Events go by whole months per tenant (``RetentionPolicy``): rows in a month partition
that every tenant has expired go with the partition (detach and drop, no row
deletes); a tenant whose policy is shorter than the others' loses its rows in the
still-shared months by row deletes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from django.conf import settings
from django.db import connection, transaction

from portal import scope
from portal.actors import Actor
from portal.ids import new_id
from portal.models import Tenant

from . import payloads, services, verify
from .models import EventCode, RetentionAnchor, RetentionPurge

ACTOR: Final = Actor.system("retention")


@dataclass
class RetentionReport:
    """What one run removed, per tenant id and partition."""

    created_partitions: list[str] = field(default_factory=list)
    purged_events: dict[str, int] = field(default_factory=dict)
    dropped_payloads: dict[str, int] = field(default_factory=dict)
    dropped_partitions: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "created_partitions": self.created_partitions,
            "purged_events": self.purged_events,
            "dropped_payloads": self.dropped_payloads,
            "dropped_partitions": self.dropped_partitions,
        }


def event_partitions_ensure(*, months_ahead: int | None = None) -> list[str]:
    """Create the month partitions of ``audit_event`` up to ``months_ahead`` ahead.

    Guarantee: idempotent and safe to overlap (the function serialises creators);
    each new partition gets its chain indexes, the parent's row-level security
    flags and its TRUNCATE triggers. Returns the partitions created.
    """
    ahead = (
        settings.PORTAL_AUDIT_PARTITIONS_AHEAD if months_ahead is None else months_ahead
    )
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute("SELECT audit_event_partitions_ensure(%s)", [ahead])
        return [row[0] for row in cursor.fetchall()]


def event_partitions() -> list[tuple[str, uuid.UUID | None, uuid.UUID | None]]:
    """The partitions of ``audit_event``: (name, lowest id, id bound), oldest first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, lower_id, upper_id FROM audit_event_partitions()")
        return list(cursor.fetchall())


@transaction.atomic(durable=True)
def tenant_events_purge(*, tenant_id: uuid.UUID) -> int:
    """Remove the tenant's expired events and append their tombstone.

    Guarantee: the removal, its purge record and anchors, and the ``audit.purged``
    tombstone commit together. Waits for a checkpoint run of the tenant (and the
    other way round). A run with nothing expired writes nothing. Returns the number
    of events purged (those still in a shared partition go with it later in the
    same retention run, see ``unscoped_retention_run``).
    """
    purge_id = new_id()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT events FROM audit_retention_purge(%s, %s, %s)",
            [tenant_id, purge_id, settings.PORTAL_AUDIT_EVENT_RETENTION_MONTHS],
        )
        events = int(cursor.fetchone()[0])
    if not events:
        return 0
    purge = RetentionPurge.objects.get(tenant_id=tenant_id, pk=purge_id)
    anchors = list(
        RetentionAnchor.objects.filter(tenant_id=tenant_id, purge_id=purge.pk)
    )
    services.event_append(
        tenant_id=tenant_id,
        code=EventCode.AUDIT_PURGED,
        actor=ACTOR,
        data=verify.tombstone_data(purge, anchors),
        publish=False,
    )
    return events


@transaction.atomic(durable=True)
def tenant_payloads_drop(*, tenant_id: uuid.UUID) -> int:
    """Drop the payloads of the tenant's events past its payload retention.

    Only chain format v2 events lose theirs (the digest stays, the chain still
    verifies); purge tombstones keep theirs. Guarantee: the drop and its
    ``audit.payloads_dropped`` event commit together; nothing due writes nothing.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT before_id, dropped FROM audit_retention_drop_payloads(%s, %s)",
            [tenant_id, settings.PORTAL_AUDIT_PAYLOAD_RETENTION_DAYS],
        )
        before_id, dropped = cursor.fetchone()
    if dropped:
        services.event_append(
            tenant_id=tenant_id,
            code=EventCode.AUDIT_PAYLOADS_DROPPED,
            actor=ACTOR,
            data=payloads.AuditPayloadsDropped(
                {"before_id": str(before_id), "events": dropped}
            ),
            publish=False,
        )
    return int(dropped)


@transaction.atomic(durable=True)
def event_partitions_drop() -> list[str]:
    """Detach and drop the month partitions every tenant has expired and purged."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT audit_retention_drop_partitions(%s)",
            [settings.PORTAL_AUDIT_EVENT_RETENTION_MONTHS],
        )
        return [row[0] for row in cursor.fetchall()]


def outbox_sent_purge(*, older_than: dt.timedelta | None = None) -> int:
    """Delete delivered (and dismissed) outbox rows older than the window, of every
    tenant.

    Pending and dead rows stay: they are work to do or evidence of failure.
    Guarantee: idempotent; one short statement per batch of 5000.
    """
    if older_than is None:
        older_than = dt.timedelta(days=settings.PORTAL_OUTBOX_SENT_RETENTION_DAYS)
    deleted = 0
    while True:
        with (
            scope.every_tenant(),
            transaction.atomic(durable=True),
            connection.cursor() as cursor,
        ):
            cursor.execute(
                """
                DELETE FROM audit_outbox WHERE id IN (
                    SELECT id FROM audit_outbox
                    WHERE state IN ('sent', 'dismissed')
                      AND coalesce(sent_at, created_at)
                          < app_now() - make_interval(secs => %s)
                    LIMIT 5000)
                """,
                [older_than.total_seconds()],
            )
            batch = cursor.rowcount
        deleted += batch
        if batch < 5000:
            return deleted


def unscoped_retention_run() -> RetentionReport:
    """One retention pass over every tenant (the daily beat job).

    Partitions ahead first; then per tenant (one transaction each) payloads, then
    events; then the month partitions every tenant has expired and purged. All in
    the scope of every tenant (``portal.scope.every_tenant``).
    """
    report = RetentionReport()
    report.created_partitions = event_partitions_ensure()
    with scope.every_tenant():
        for tenant_id in Tenant.objects.order_by("pk").values_list("pk", flat=True):
            dropped = tenant_payloads_drop(tenant_id=tenant_id)
            if dropped:
                report.dropped_payloads[str(tenant_id)] = dropped
            purged = tenant_events_purge(tenant_id=tenant_id)
            if purged:
                report.purged_events[str(tenant_id)] = purged
        report.dropped_partitions = event_partitions_drop()
    return report
