"""The chain's head row (audit migrations 0014, 0017) under real parallel appends.

``event_append``'s statement moves a chain's ``audit_chainhead`` row forward as it
inserts the event, under the row's lock, and makes the row on the chain's first
append (a first append that loses that race runs again). Several connections
appending at once, from the very first event of a chain, must still give one line
whose head row names its last event; and an append outside its tenant's scope
(row-level security) must be refused without moving the row.
"""

from __future__ import annotations

import io
import threading
import time
import uuid

import pytest
from django.core.management import call_command
from django.db import ProgrammingError, connection, transaction

from audit import services as audit_services
from audit.models import ChainHead, Event, EventCode
from portal import scope
from portal.actors import Actor
from portal.models import Tenant
from tests.db.test_audit_chain import append
from tests.support.concurrency import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = Actor.system("chain-head")


def _assert_one_line_with_its_head(
    tenant: Tenant, task_id: uuid.UUID | None, count: int
) -> None:
    rows = list(
        Event.objects.filter(tenant=tenant, task_id=task_id)
        .order_by("chain_seq")
        .values_list("chain_seq", "prev_hash", "hash", "id")
    )
    assert [seq for seq, _, _, _ in rows] == list(range(1, count + 1))
    assert rows[0][1] is None
    assert all(rows[i][1] == rows[i - 1][2] for i in range(1, len(rows)))
    head = ChainHead.objects.get(tenant=tenant, task_id=task_id)
    assert (head.head_seq, head.head_hash, head.head_event_id) == (
        count,
        rows[-1][2],
        rows[-1][3],
    )


@pytest.mark.parametrize("chain", ["task", "tenant"])
def test_parallel_first_appends_make_one_head_and_one_line(
    tenant: Tenant, chain: str
) -> None:
    # given a chain with no event and no head row yet
    task_id = uuid.uuid4() if chain == "task" else None
    assert not ChainHead.objects.filter(tenant=tenant, task_id=task_id).exists()
    threads, per_thread = 6, 4
    barrier = threading.Barrier(threads, timeout=10)

    def appender() -> int:
        barrier.wait()
        for n in range(per_thread):
            append(tenant, task_id, n)
        return per_thread

    # when six connections start it at the same moment
    outcomes = run_in_threads(*[appender] * threads)

    # then one head row and one line, the row at its last event
    assert outcomes == [per_thread] * threads
    _assert_one_line_with_its_head(tenant, task_id, threads * per_thread)
    assert ChainHead.objects.filter(tenant=tenant, task_id=task_id).count() == 1
    out = io.StringIO()
    call_command("verify_audit", tenant=tenant.slug, stdout=out, stderr=out)
    assert "BROKEN" not in out.getvalue()


@pytest.mark.parametrize("scoped_to", ["no tenant", "another tenant"])
def test_an_append_outside_its_tenants_scope_is_refused_and_the_head_stays(
    tenant: Tenant, other_tenant: Tenant, scoped_to: str
) -> None:
    task_id = uuid.uuid4()
    append(tenant, task_id, 1)
    ids = [] if scoped_to == "no tenant" else [other_tenant.pk]
    # when a job appends to the tenant's chain outside the tenant's scope
    with (
        scope.tenant_scope(ids),
        pytest.raises(ProgrammingError, match="row-level security"),
        transaction.atomic(),
    ):
        audit_services.event_append(
            tenant_id=tenant.pk, task_id=task_id, code=EventCode.TASK_LEASE_EXPIRED,
            actor=ACTOR, data={"n": 2},
        )  # fmt: skip
    # then nothing was written: the chain and its head are as they were
    _assert_one_line_with_its_head(tenant, task_id, 1)


def test_a_first_append_that_loses_the_race_to_make_the_head_runs_again() -> None:
    """The one path a plain parallel run may not hit: B's statement finds no head
    row (A made it and has not committed), waits in ``ON CONFLICT`` for A, writes
    nothing, and ``event_append`` runs it again, now linked after A's event."""
    tenant = Tenant.objects.create(slug="race", name="Race")
    task_id = uuid.uuid4()
    a_written, a_may_commit = threading.Event(), threading.Event()
    b_pid: list[int] = []

    def first() -> str:
        with transaction.atomic():
            audit_services.event_append(
                tenant_id=tenant.pk, task_id=task_id,
                code=EventCode.TASK_TRANSITIONED, actor=ACTOR, data={"n": 1},
            )  # fmt: skip
            a_written.set()
            assert a_may_commit.wait(20)
        return "a"

    def second() -> str:
        assert a_written.wait(20)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            b_pid.append(cursor.fetchone()[0])
        append(tenant, task_id, 2)
        return "b"

    def release_a_once_b_waits() -> str:
        with connection.cursor() as cursor:
            for _ in range(400):
                cursor.execute(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity"
                    " WHERE pid = %s",
                    [b_pid[0] if b_pid else 0],
                )
                row = cursor.fetchone()
                if row == ("Lock", "transactionid"):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("B never waited on A's head row")
        a_may_commit.set()
        return "released"

    outcomes = run_in_threads(first, second, release_a_once_b_waits)

    assert outcomes == ["a", "b", "released"]
    _assert_one_line_with_its_head(tenant, task_id, 2)
