"""Reads of the audit trail."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Final

from django.db.models import Q, QuerySet

from portal.ids import id_floor
from portal.models import Tenant

from .models import Event, Outbox


def event_list(*, tenant: Tenant, task_id: uuid.UUID | None = None) -> QuerySet[Event]:
    """The tenant's events, oldest first (optionally of one task)."""
    events = Event.objects.filter(tenant=tenant)
    if task_id is not None:
        events = events.filter(task_id=task_id)
    return events.order_by("id")


def outbox_list(*, tenant: Tenant) -> QuerySet[Outbox]:
    """The tenant's outbox rows, oldest first."""
    return Outbox.objects.filter(tenant=tenant).order_by("id")


# How far an event's id time may be from its created_at: the CHECK
# audit_event_id_time_check (migration 0011) holds every row to it.
ID_TIME_TOLERANCE: Final = dt.timedelta(days=1)


def event_created_range(
    *, created_from: dt.datetime | None = None, created_to: dt.datetime | None = None
) -> Q:
    """Events created from (inclusive) / until (exclusive), with the id bounds that
    let PostgreSQL prune the month partitions (``audit_event`` is partitioned on its
    UUIDv7 id, not on created_at; docs/retention.md shows the plans).

    Sound because the CHECK keeps every id within ``ID_TIME_TOLERANCE`` of its
    created_at: the id bounds only widen the range by that much.
    """
    q = Q()
    if created_from is not None:
        q &= Q(created_at__gte=created_from)
        q &= Q(id__gte=id_floor(created_from - ID_TIME_TOLERANCE))
    if created_to is not None:
        q &= Q(created_at__lt=created_to)
        q &= Q(id__lt=id_floor(created_to + ID_TIME_TOLERANCE))
    return q
