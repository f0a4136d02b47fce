"""The relay's row updates: the claim is HOT, the ``sent`` mark the one that is not.

Migration 0029 moved the relay's lease out of ``available_at`` (a key of
``audit_outbox_due_idx``) into ``leased_until``, which no index names, and left half
of each page free (``fillfactor``) so the claim's new row versions stay on their page:
PostgreSQL then writes no index entry for them (a heap-only tuple). The counts come
from the transaction's own statistics (``pg_stat_get_xact_tuples_hot_updated``), read
before it commits. docs/outbox.md, "Row updates".
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction

from audit import relay
from audit import services as audit_services
from audit.models import EventCode
from portal.actors import Actor
from portal.models import Tenant
from portal.tracing import Trace

pytestmark = pytest.mark.django_db(transaction=True)


def _append(tenant: Tenant, task_ids: list[uuid.UUID | None]) -> None:
    with transaction.atomic(durable=True):
        for n, task_id in enumerate(task_ids):
            audit_services.event_append(
                tenant_id=tenant.pk,
                code=EventCode.TASK_TRANSITIONED,
                actor=Actor.system("hot-tests"),
                task_id=task_id,
                data={"n": n, "note": "x" * (n * 7 % 90)},  # rows of varied sizes
                trace=Trace.new(),
            )


def _updates(statement: str, params: Any) -> tuple[int, int, int]:
    """Run ``statement`` in a transaction of its own: rows it returned or changed,
    and the table's updates and HOT updates it made. The session's counters hold
    earlier transactions' counts until they are flushed, hence the difference."""
    counters = (
        "SELECT pg_stat_get_xact_tuples_updated('audit_outbox'::regclass),"
        " pg_stat_get_xact_tuples_hot_updated('audit_outbox'::regclass)"
    )
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(counters)
        updated_before, hot_before = cursor.fetchone()
        cursor.execute(statement, params)
        rows = cursor.rowcount
        cursor.execute(counters)
        updated, hot = cursor.fetchone()
    return rows, updated - updated_before, hot - hot_before


def test_the_claim_is_a_hot_update_and_the_sent_mark_is_not(tenant: Tenant) -> None:
    # given: 60 pending rows, freshly written (whole new pages), over four tasks
    # and without a task
    tasks: list[uuid.UUID | None] = [uuid.uuid4() for _ in range(4)] + [None]
    _append(tenant, [tasks[n % 5] for n in range(60)])

    # when: the relay's claim leases them (its statement, as the relay runs it)
    claimed, updated, hot = _updates(
        relay._CLAIM,
        {"limit": 200, "lease_s": float(settings.PORTAL_OUTBOX_CLAIM_LEASE_S)},
    )

    # then: every row was claimed (heads and followers) and every update was HOT
    assert claimed == 60
    assert (updated, hot) == (60, 60)

    # when: they are marked sent (state moves, and state is in the partial
    # indexes' predicates)
    with connection.cursor() as cursor:
        cursor.execute("SELECT array_agg(id) FROM audit_outbox WHERE state = 'pending'")
        (ids,) = cursor.fetchone()
    marked, updated, hot = _updates(relay._MARK_SENT, {"ids": ids})

    # then: those updates write index entries: the counter sees a non-HOT update
    assert marked == 60
    assert (updated, hot) == (60, 0)


def test_the_outbox_leaves_room_on_its_pages_and_no_index_names_the_lease() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'audit_outbox'::regclass"
        )
        (options,) = cursor.fetchone()
        cursor.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index i"
            " WHERE i.indrelid = 'audit_outbox'::regclass"
            " AND (pg_get_indexdef(i.indexrelid) ~ 'leased_until'"
            "      OR coalesce(pg_get_expr(i.indpred, i.indrelid), '') ~ 'leased_until')"
        )
        naming_the_lease = cursor.fetchall()
    assert options == ["fillfactor=45"]
    assert naming_the_lease == []
