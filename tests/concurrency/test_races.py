"""Races between real connections: threads, each with its own PostgreSQL session,
lined up on a barrier (docs/style.md R18). Sizes are parameters: PORTAL_RACE_SCALE=10
runs the same tests ten times larger by hand.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

import pytest
from django.db import connection

from audit.models import Event, EventCode
from portal.actors import Actor
from portal.exceptions import IdempotencyKeyReused, LeaseExpired, StaleState
from tasks import services
from tasks.exceptions import LeaseHeld
from tasks.models import Operation, Task, TaskState
from tests.support.concurrency import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)

SCALE = int(os.environ.get("PORTAL_RACE_SCALE", "1"))


def test_one_of_two_same_version_writers_wins(make_task, actor):
    """Two deliveries of the same transition: exactly one commits, one event."""
    task = make_task(state=TaskState.RUNNING, leased=True)
    barrier = threading.Barrier(2, timeout=10)

    def finish(to: str) -> Task:
        barrier.wait()
        return services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=to,
            actor=actor,
            expected_version=task.state_version,
            lease_token=task.lease_token,
        )

    outcomes = run_in_threads(
        lambda: finish(TaskState.SUCCEEDED), lambda: finish(TaskState.FAILED)
    )
    winners = [o for o in outcomes if isinstance(o, Task)]
    assert len(winners) == 1, outcomes
    assert sum(isinstance(o, StaleState) for o in outcomes) == 1, outcomes
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (winners[0].state, 2)
    assert Event.objects.filter(code=EventCode.TASK_TRANSITIONED).count() == 1


def test_eight_workers_claim_each_pending_task_exactly_once(tenant, agent):
    """8 workers drain 1,000 pending tasks with SKIP LOCKED: no task twice, none lost."""
    size = 1000 * SCALE
    Task.objects.bulk_create(
        Task(
            tenant=tenant,
            client_task_id=f"bulk-{n}",
            registration_hash="0" * 64,
            workflow_key="w",
            workflow_version="1",
            object_type="o",
            object_id=str(n),
            object_version="1",
        )
        for n in range(size)
    )
    barrier = threading.Barrier(8, timeout=10)

    def worker(name: str) -> list:
        actor = Actor.of_agent(agent)
        claimed = []
        barrier.wait()
        while (
            task := services.task_claim_next(tenant=tenant, owner=name, actor=actor)
        ) is not None:
            claimed.append(task.pk)
        return claimed

    outcomes = run_in_threads(
        *[lambda n=n: worker(f"worker-{n}") for n in range(8)], timeout=300
    )
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    claims = Counter(pk for claimed in outcomes for pk in claimed)
    assert len(claims) == size and set(claims.values()) == {1}
    assert sum(1 for claimed in outcomes if claimed) > 1  # the work really was shared
    assert (
        not Task.objects.filter(tenant=tenant).exclude(state=TaskState.RUNNING).exists()
    )
    assert Event.objects.filter(code=EventCode.TASK_CLAIMED).count() == size


def _reserve_all(task, actor, inputs: list[dict]) -> list:
    barrier = threading.Barrier(len(inputs), timeout=10)

    def reserve(payload: dict):
        barrier.wait()
        return services.operation_reserve(
            tenant=task.tenant,
            task_id=task.pk,
            lease_token=task.lease_token,
            idempotency_key="ticket-for-issue-42",
            action="create_ticket",
            target="desk",
            input=payload,
            actor=actor,
        )

    return run_in_threads(*[lambda p=p: reserve(p) for p in inputs])


def test_sixteen_reservations_of_one_key_and_input_make_one_operation(make_task, actor):
    task = make_task(state=TaskState.RUNNING, leased=True)
    outcomes = _reserve_all(task, actor, [{"queue": "billing"}] * 16)
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert len({o.operation.pk for o in outcomes}) == 1
    assert sum(o.created for o in outcomes) == 1
    assert Operation.objects.count() == 1
    assert Event.objects.filter(code=EventCode.OPERATION_RESERVED).count() == 1


def test_sixteen_reservations_of_one_key_with_different_inputs_accept_one(
    make_task, actor
):
    task = make_task(state=TaskState.RUNNING, leased=True)
    outcomes = _reserve_all(task, actor, [{"queue": f"q{n}"} for n in range(16)])
    accepted = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(accepted) == 1 and accepted[0].created
    assert sum(isinstance(o, IdempotencyKeyReused) for o in outcomes) == 15, outcomes
    stored = Operation.objects.get()
    assert stored.input == accepted[0].operation.input


@pytest.mark.parametrize("round_", range(5 * SCALE))
def test_a_worker_fenced_out_by_a_takeover_cannot_write(make_task, actor, round_):
    """Worker A's lease lapsed; B takes over while A writes with its old token."""
    task = make_task(state=TaskState.RUNNING, leased=True)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_task SET lease_expires_at = app_now() - interval '1 ms' "
            "WHERE id = %s",
            [task.pk],
        )
    barrier = threading.Barrier(2, timeout=10)

    def stale_worker():
        barrier.wait()
        return services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            actor=actor,
            expected_version=task.state_version,
            lease_token=task.lease_token,
        )

    def new_worker():
        barrier.wait()
        return services.task_lease_acquire(
            tenant=task.tenant, task_id=task.pk, owner="worker-2", actor=actor
        )

    stale, taken = run_in_threads(stale_worker, new_worker)
    assert isinstance(stale, LeaseExpired), stale
    assert isinstance(taken, Task) and taken.lease_token == task.lease_token + 1
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version, stored.lease_owner) == (
        TaskState.RUNNING,
        1,
        "worker-2",
    )
    assert not Event.objects.filter(code=EventCode.TASK_TRANSITIONED).exists()


def test_a_live_lease_is_never_taken_twice(make_task, actor):
    """8 workers race to acquire one free task: exactly one lease, one token."""
    task = make_task(state=TaskState.PENDING)
    barrier = threading.Barrier(8, timeout=10)

    def acquire(n: int):
        barrier.wait()
        return services.task_lease_acquire(
            tenant=task.tenant, task_id=task.pk, owner=f"w{n}", actor=actor
        )

    outcomes = run_in_threads(*[lambda n=n: acquire(n) for n in range(8)])
    assert sum(isinstance(o, Task) for o in outcomes) == 1, outcomes
    assert sum(isinstance(o, LeaseHeld) for o in outcomes) == 7
    assert Task.objects.get(pk=task.pk).lease_token == 1
