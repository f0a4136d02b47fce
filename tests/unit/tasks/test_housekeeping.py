"""The lease reaper and the wake-up: batch services the beat jobs call."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection

from audit.models import Event, EventCode
from portal import metrics
from tasks import jobs, services
from tasks.models import OperationState, Task, TaskState
from tests.support.concurrency import run_in_threads


def lapse(task: Task) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_task SET lease_expires_at = app_now() - interval '1 s' "
            "WHERE id = %s",
            [task.pk],
        )


@pytest.mark.django_db
def test_a_lapsed_running_task_returns_to_pending(make_task, make_operation):
    task = make_task(state=TaskState.RUNNING, leased=True, lease_token=4)
    in_flight = make_operation(task=task, state=OperationState.EXECUTING)
    live = make_task(state=TaskState.RUNNING, leased=True)  # not lapsed: untouched
    lapse(task)
    assert services.unscoped_leases_reap() == 1
    task.refresh_from_db()
    assert (task.state, task.state_version, task.reason_code) == (
        "pending",
        2,
        "LEASE_EXPIRED",
    )
    assert task.lease_owner is None
    assert task.lease_token == 4  # the next acquisition raises it
    in_flight.refresh_from_db()
    assert in_flight.next_check_at is not None  # recovery looks at it now
    assert Task.objects.get(pk=live.pk).lease_owner == "worker-1"
    event = Event.objects.get(task_id=task.pk)
    assert (event.code, event.actor_type) == (EventCode.TASK_LEASE_EXPIRED, "system")


@pytest.mark.django_db
def test_a_persons_lapsed_claim_returns_to_the_queue(make_task):
    task = make_task(state=TaskState.HUMAN_CLAIMED, leased=True)
    lapse(task)
    jobs.reap_leases_job()
    task.refresh_from_db()
    assert (task.state, task.reason_code) == ("human_required", "LEASE_EXPIRED")


@pytest.mark.django_db
def test_waiting_tasks_wake_when_due(make_task):
    due = make_task(
        state=TaskState.WAITING, wake_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    )
    later = make_task(
        state=TaskState.WAITING, wake_at=dt.datetime(2999, 1, 1, tzinfo=dt.UTC)
    )
    assert jobs.wake_tasks_job() == 1
    due.refresh_from_db()
    assert (due.state, due.state_version, due.wake_at) == ("pending", 2, None)
    assert Task.objects.get(pk=later.pk).state == "waiting"
    assert Event.objects.get(task_id=due.pk).code == EventCode.TASK_WOKEN


@pytest.mark.django_db(transaction=True)
def test_two_reapers_at_once_reap_each_task_once(make_task):
    tasks = [make_task(state=TaskState.RUNNING, leased=True) for _ in range(60)]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_task SET lease_expires_at = app_now() - interval '1 s'"
        )
    barrier = threading.Barrier(3, timeout=10)

    def reap() -> int:
        barrier.wait()
        return sum(services.unscoped_leases_reap(limit=7) for _ in range(20))

    counts = run_in_threads(reap, reap, reap)
    assert sum(counts) == len(tasks), counts
    assert Event.objects.filter(code=EventCode.TASK_LEASE_EXPIRED).count() == len(tasks)
    assert set(Task.objects.values_list("state_version", flat=True)) == {2}


def expiries(state: str) -> float:
    return metrics.LEASE_EXPIRIES.labels(state)._value.get()


@pytest.mark.django_db
def test_lease_expiries_are_counted_when_the_reap_commits(
    make_task, django_capture_on_commit_callbacks
):
    agents = [make_task(state=TaskState.RUNNING, leased=True) for _ in range(2)]
    person = make_task(state=TaskState.HUMAN_CLAIMED, leased=True)
    for task in (*agents, person):
        lapse(task)
    running, claimed = expiries("running"), expiries("human_claimed")
    with django_capture_on_commit_callbacks(execute=False) as pending:
        assert services.unscoped_leases_reap() == 3
    assert expiries("running") == running  # not before the commit
    for callback in pending:
        callback()
    assert (expiries("running"), expiries("human_claimed")) == (
        running + 2,
        claimed + 1,
    )
