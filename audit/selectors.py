"""Reads of the audit trail."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

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
