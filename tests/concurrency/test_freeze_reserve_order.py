"""A freeze and a reservation take their locks in one order: the agent (and tenant)
row, then the task (docs/limits.md, "Lock order"). Real connections, each in its
own thread; the freeze's side is its statements in its order, paused where the
reservation must meet it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from audit.models import Event, EventCode
from portal.actors import Actor
from portal.exceptions import AgentFrozen, LeaseExpired
from tasks import services
from tasks.models import Operation, Task, TaskState
from tests.support.concurrency import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)


def _waits_on_a_lock(pid: int) -> bool:
    """Whether backend ``pid`` waits for a lock now (the lock table, read live: not
    pg_stat_activity, whose rows stay as first read in a transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [pid])
        row = cursor.fetchone()
    return bool(row and row[0])


def test_a_reservation_meeting_a_freeze_waits_and_is_refused_without_deadlock(
    make_task: Any, actor: Actor
) -> None:
    """The freeze holds the agent row when a reservation starts; the reservation
    waits in its first statement, before it locks the task, so the freeze's
    expiry of the task's lease goes through at once and the reservation is
    refused after the freeze commits (read in the old order, the task first, the
    two waited for each other until PostgreSQL rolled one back as a deadlock)."""
    # Given: a leased task of the agent.
    task: Task = make_task(state=TaskState.RUNNING, leased=True)
    locked = threading.Event()  # the freeze holds the agent row
    started = threading.Event()  # the reservation's connection is known
    pid: list[int] = []
    outcome: list[Any] = []  # what the reservation returned or raised, once done

    def freeze() -> str:
        with transaction.atomic(), connection.cursor() as cursor:
            # agent_freeze's order: the agent row, then the leases, then the flag.
            cursor.execute(
                "SELECT 1 FROM portal_agent WHERE id = %s FOR UPDATE", [actor.id]
            )
            locked.set()
            assert started.wait(10)
            deadline = time.monotonic() + 10
            while not _waits_on_a_lock(pid[0]):
                assert not outcome, f"the reservation ended without waiting: {outcome}"
                assert time.monotonic() < deadline, "the reservation never waited"
                time.sleep(0.02)
            cursor.execute("SET LOCAL lock_timeout = '3s'")
            cursor.execute(
                "UPDATE tasks_task SET lease_expires_at = app_now()"
                " WHERE tenant_id = %s AND id = %s",
                [task.tenant_id, task.pk],
            )
            cursor.execute(
                "UPDATE portal_agent SET frozen_at = app_now() WHERE id = %s",
                [actor.id],
            )
        return "frozen"

    def reserve() -> Any:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid.append(cursor.fetchone()[0])
        # Only once the freeze holds the agent row (started first, the reservation
        # could be done before the freeze began, and nothing would be tested).
        assert locked.wait(10)
        started.set()
        try:
            reserved = services.operation_reserve(
                tenant=task.tenant,
                task_id=task.pk,
                lease_token=task.lease_token,
                idempotency_key="during-a-freeze",
                action="create_ticket",
                target="desk",
                input={"queue": "billing"},
                actor=actor,
            )
        except Exception as error:
            outcome.append(error)
            raise
        outcome.append(reserved)
        return reserved

    # When: the reservation starts while the freeze holds the agent row.
    frozen, reserved = run_in_threads(freeze, reserve)

    # Then: the freeze committed, the reservation was refused, nothing reserved.
    assert frozen == "frozen", frozen
    assert isinstance(reserved, LeaseExpired | AgentFrozen), reserved
    assert not Operation.objects.filter(tenant=task.tenant).exists()
    assert not Event.objects.filter(code=EventCode.OPERATION_RESERVED).exists()
