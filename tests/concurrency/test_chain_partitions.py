"""A chain stays a line across month partitions (audit migration 0011).

The chain's unique indexes are per partition, so the database alone would accept
the same place in a chain twice when the two rows land in different months; what
keeps appends in line is the lock on the chain's head row (audit migration 0014). These tests prove it with
real parallel connections, and show what the verifier says about a fork made
around the lock.
"""

from __future__ import annotations

import datetime as dt
import io
import threading
import uuid

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from audit import chain
from audit import services as audit_services
from audit.models import Event, EventCode
from portal import ids
from portal.actors import Actor
from portal.models import Tenant
from tests.support.audit_events import chain_head_locked, chain_head_moved
from tests.support.concurrency import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = Actor.system("chain-partitions")


def _future_head(tenant: Tenant, task_id: uuid.UUID) -> str:
    """Chain #1 written two months ahead: a partition the new appends do not use."""
    when = (dt.datetime.now(dt.UTC) + dt.timedelta(days=62)).replace(microsecond=0)
    event_id = ids.id_at(when)
    payload = {"n": 0}
    digest = chain.payload_digest(payload)
    content = chain.event_content(
        event_id=event_id, tenant_id=tenant.pk, task_id=task_id, operation_id=None,
        code=EventCode.TASK_TRANSITIONED, actor_type="system",
        actor_id="chain-partitions", reason_code=None, contract_key=None,
        contract_version=None, payload=payload, payload_digest=digest, trace_id="",
        span_id="", created_at=when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )  # fmt: skip
    digest_hash = chain.event_hash(prev_hash=None, content=content)
    with transaction.atomic(), connection.cursor() as cursor:
        assert chain_head_locked(cursor, tenant.pk, task_id) == (0, None)
        cursor.execute(
            "INSERT INTO audit_event (id, tenant_id, task_id, code, actor_type,"
            " actor_id, payload, payload_digest, trace_id, span_id, created_at,"
            " chain_seq, prev_hash, hash) VALUES (%s, %s, %s, %s, 'system',"
            " 'chain-partitions', %s::jsonb, %s, '', '', %s, 1, NULL, %s)",
            [event_id, tenant.pk, task_id, EventCode.TASK_TRANSITIONED,
             audit_services.json_text(payload), digest, when, digest_hash],
        )  # fmt: skip
        chain_head_moved(cursor, tenant.pk, task_id, 1, event_id, digest_hash)
        cursor.execute(
            "SELECT tableoid::regclass::text FROM audit_event WHERE id = %s",
            [event_id],
        )
        return str(cursor.fetchone()[0])


def test_parallel_appends_across_partitions_never_fork(tenant: Tenant) -> None:
    # given a chain whose head is in another month's partition than today's
    task_id = uuid.uuid4()
    head_partition = _future_head(tenant, task_id)
    threads, per_thread = 6, 5
    barrier = threading.Barrier(threads, timeout=10)

    def appender() -> int:
        barrier.wait()
        for n in range(per_thread):
            with transaction.atomic():
                audit_services.event_append(
                    tenant_id=tenant.pk,
                    task_id=task_id,
                    code=EventCode.TASK_TRANSITIONED,
                    actor=ACTOR,
                    data={"n": n},
                )
        return per_thread

    # when six connections append to it at once
    outcomes = run_in_threads(*[appender] * threads)

    # then every append got its own place, one line, across two partitions
    assert outcomes == [per_thread] * threads
    rows = list(
        Event.objects.filter(tenant=tenant, task_id=task_id)
        .order_by("chain_seq")
        .values_list("chain_seq", "prev_hash", "hash")
    )
    assert [seq for seq, _, _ in rows] == list(range(1, threads * per_thread + 2))
    assert all(rows[i][1] == rows[i - 1][2] for i in range(1, len(rows)))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT tableoid::regclass::text FROM audit_event"
            " WHERE task_id = %s",
            [task_id],
        )
        used = {name for (name,) in cursor.fetchall()}
    assert head_partition in used
    assert len(used) == 2
    out = io.StringIO()
    call_command("verify_audit", tenant=tenant.slug, stdout=out, stderr=out)
    assert "BROKEN" not in out.getvalue()


def test_a_fork_made_around_the_lock_is_reported(tenant: Tenant) -> None:
    """The database accepts #2 twice in two months; verify_audit names it."""
    task_id = uuid.uuid4()
    _future_head(tenant, task_id)
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk, task_id=task_id, code=EventCode.TASK_TRANSITIONED,
            actor=ACTOR, data={"n": 1},
        )  # fmt: skip
    second = Event.objects.get(task_id=task_id, chain_seq=2)
    # a forger copies #2 with a new id into the head's partition (no lock taken)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO audit_event (id, tenant_id, task_id, operation_id, code,"
            " actor_type, actor_id, reason_code, contract_key, contract_version,"
            " payload, trace_id, span_id, created_at, chain_seq, prev_hash, hash,"
            " payload_digest)"
            " SELECT audit_uuid7_at(e.created_at + interval '62 days'), tenant_id,"
            " task_id, operation_id, code, actor_type, actor_id, reason_code,"
            " contract_key, contract_version, payload, trace_id, span_id,"
            " created_at + interval '62 days', chain_seq, prev_hash, hash,"
            " payload_digest FROM audit_event e WHERE e.id = %s",
            [second.pk],
        )
    assert Event.objects.filter(task_id=task_id, chain_seq=2).count() == 2
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("verify_audit", tenant=tenant.slug, stdout=out, stderr=out)
    assert "inserted" in out.getvalue() or "altered" in out.getvalue(), out.getvalue()
