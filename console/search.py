"""Exact, index-served searches of the event browser and the task list.

Django's ``=field`` search compares ``UPPER(field) = UPPER(term)``, which no index
serves (21 s for a trace id over 5M events). These compare the columns themselves,
parse a UUID where the column is a UUID, and first resolve what points at events
(tasks by trace, object or client id; operations by idempotency key) with their own
indexed lookups, so the event query is an OR of index scans.

Indexes: ``audit_event_trace_idx`` (tenant_id, trace_id), ``audit_event_task_idx``
(tenant_id, task_id, id), ``audit_event_operation_idx``, the event primary key;
``tasks_task_trace_idx`` / ``tasks_task_object_idx``, the task's unique
(tenant_id, client_task_id) and the operation's unique (tenant_id, idempotency_key).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Final

from django.db.models import Q, QuerySet

from audit.models import Event
from audit.redaction import search_token
from tasks.models import Operation, Task

# How many tasks (or operations) one search term may fan out to; an object id with
# more tasks than this shows the events of the newest ones.
FAN_OUT_LIMIT: Final = 1000
MAX_TERM_CHARS: Final = 200
# "value:<text>" finds operations whose stored (redacted) input, call fields or
# result carry the keyed hash of <text>: an e-mail address, a card number or a
# declared field's value, matched without the value being stored. Not index-served
# (a scan of the person's tenants' operations), so only on this explicit prefix.
VALUE_PREFIX: Final = "value:"


def _uuid(term: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(term)
    except ValueError:
        return None


def clean_term(term: str) -> str:
    """The search box's text as one exact value (ids hold no spaces to split on)."""
    return term.strip()[:MAX_TERM_CHARS]


def task_ids_matching(*, tenant_ids: Sequence[uuid.UUID], term: str) -> list[uuid.UUID]:
    """Tasks of these tenants whose trace, object or client task id is ``term``."""
    match = Q(trace_id=term) | Q(object_id=term) | Q(client_task_id=term)
    return list(
        Task.objects.filter(match, tenant_id__in=tenant_ids)
        .order_by("-id")
        .values_list("id", flat=True)[:FAN_OUT_LIMIT]
    )


def event_search(
    queryset: QuerySet[Event], *, tenant_ids: Sequence[uuid.UUID], term: str
) -> QuerySet[Event]:
    """Events for one term: a trace id, object id, idempotency key or an id.

    A trace id also finds the events of the tasks that carry it, so a person's claim
    or resolution (recorded under a new trace) belongs to the task's story. Every
    lookup stays within ``tenant_ids`` (the tenants the person may read).
    """
    term = clean_term(term)
    if not term:
        return queryset
    match = Q(trace_id=term)
    task_ids = task_ids_matching(tenant_ids=tenant_ids, term=term)
    operation_ids = list(
        Operation.objects.filter(tenant_id__in=tenant_ids, idempotency_key=term)
        .order_by("-id")
        .values_list("id", flat=True)[:FAN_OUT_LIMIT]
    )
    as_uuid = _uuid(term)
    if as_uuid is not None:
        task_ids.append(as_uuid)
        operation_ids.append(as_uuid)
        match |= Q(pk=as_uuid)
    if task_ids:
        match |= Q(task_id__in=task_ids)
    if operation_ids:
        match |= Q(operation_id__in=operation_ids)
    return queryset.filter(match)


def task_search(queryset: QuerySet[Task], *, term: str) -> QuerySet[Task]:
    """Tasks for one term: trace id, object id, client task id or the task's id."""
    term = clean_term(term)
    if not term:
        return queryset
    match = Q(trace_id=term) | Q(object_id=term) | Q(client_task_id=term)
    as_uuid = _uuid(term)
    if as_uuid is not None:
        match |= Q(pk=as_uuid)
    return queryset.filter(match)


def operation_search(
    queryset: QuerySet[Operation],
    *,
    term: str,
    tenant_ids: Sequence[uuid.UUID] = (),
) -> QuerySet[Operation]:
    """Operations for one term: the idempotency key, or an operation or task id;
    ``value:<text>``: the operations whose redacted values hold <text>'s keyed hash
    in one of ``tenant_ids`` (each tenant hashes with its own key)."""
    term = clean_term(term)
    if not term:
        return queryset
    if term.startswith(VALUE_PREFIX):
        value = term[len(VALUE_PREFIX) :].strip()
        by_value = Q(pk__in=[])
        for tenant_id in tenant_ids:
            token = search_token(tenant_id, value)
            if token is None:
                continue
            by_value |= Q(tenant_id=tenant_id) & (
                Q(input__icontains=token)
                | Q(call_fields__icontains=token)
                | Q(result__icontains=token)
            )
        return queryset.filter(by_value)
    match = Q(idempotency_key=term)
    as_uuid = _uuid(term)
    if as_uuid is not None:
        match |= Q(pk=as_uuid) | Q(task_id=as_uuid)
    return queryset.filter(match)
