"""A worker whose clock is minutes off: the database's clock decides (issue 25).

The worker is a real process (``tests/support/gateway_child.py``) run under Debian's
``faketime``: its wall clock (``time.time()``, ``datetime.now()``, UUIDv7 ids) is ten
minutes ahead or behind; PostgreSQL's is not. It renews its lease for 5 s, executes a
``create_ticket`` and dies (SIGKILL) right after the desk made the ticket, as in R12.
What time decides must then be the database's:

- the lease's expiry is ``app_now() + 5 s`` (a worker ahead would otherwise hold it
  ten minutes; one behind would find it lapsed before its first write), and another
  worker can take it over 5 s later, not ten minutes;
- the in-doubt deadline of the call (``next_check_at``) is ``app_now() + 3 s``, so the
  settle job (in this process, on the true clock) settles it within seconds by the
  desk's receipt;
- the credential's issue and expiry, and every event's ``created_at``, are stamped
  between two readings of the database's clock around the run.

One ticket at the desk, the operation ``verified`` with it, and the fault tier's
checks on the events.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import connection

from portal.db import db_now
from tasks import services as task_services
from tasks.jobs import check_receipts_job
from tasks.models import Operation, Task

from .conftest import EXECUTION_DEADLINE_S, World
from .harness import check, operation_views
from .processes import faketime, start_child, wait_for

LEASE_TTL_S = 5.0
SKEW_S = 600

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]


def _between(value: dt.datetime, low: dt.datetime, high: dt.datetime) -> bool:
    return low <= value <= high


@pytest.mark.parametrize("sign", [+1, -1], ids=["ahead", "behind"])
def test_a_worker_with_a_skewed_clock_lives_by_the_database_clock(
    world: World, sign: int
) -> None:
    faketime()  # fails under CI when missing, skips elsewhere
    # Given a reserved create_ticket under a running task
    planned = world.plan(0)
    operation = Operation.objects.get(pk=planned.operation_id)
    ttl, deadline = (
        dt.timedelta(seconds=LEASE_TTL_S),
        dt.timedelta(seconds=EXECUTION_DEADLINE_S),
    )
    # When a worker ten minutes ahead (behind) renews the lease, executes, and dies
    # right after the desk made the ticket
    before, host_before = db_now(), time.time()
    child = start_child(
        world,
        planned,
        lease_ttl_s=LEASE_TTL_S,
        crash_at="after_call",
        skew=f"{'+' if sign > 0 else '-'}{SKEW_S // 60}m",
    )
    try:
        output = child.finish()
    finally:
        child.kill()
    after, host_after = db_now(), time.time()
    assert child.process.returncode == -9, output  # SIGKILLed after the call
    # Then its own clock was off by the skew (faketime took)
    skew = child.lines(output)[0]["clock"] - host_before
    assert sign * SKEW_S - 5 <= skew <= sign * SKEW_S + (host_after - host_before) + 5
    # And the lease, the deadline, the credential and the events read the database's
    task = Task.objects.get(pk=operation.task_id)
    lapses_at = task.lease_expires_at
    assert lapses_at is not None
    assert _between(lapses_at, before + ttl, after + ttl)
    executing = Operation.objects.get(pk=planned.operation_id)
    assert executing.state == "executing"
    assert executing.next_check_at is not None
    assert _between(executing.next_check_at, before + deadline, after + deadline)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT issued_at, expires_at FROM tasks_credential WHERE operation_id = %s",
            [planned.operation_id],
        )
        credentials = cursor.fetchall()
        cursor.execute(
            "SELECT code, created_at FROM audit_event WHERE tenant_id = %s"
            " AND created_at >= %s",
            [world.tenant.pk, before],
        )
        events = cursor.fetchall()
    assert credentials
    for issued_at, expires_at in credentials:
        assert _between(issued_at, before, after)
        assert issued_at < expires_at <= after + dt.timedelta(hours=1)
    assert {"gateway.checked", "operation.executing"} <= {code for code, _ in events}
    assert all(_between(created_at, before, after) for _, created_at in events)
    # And another worker takes the lease over once it lapses by the database's
    # clock (seconds, not ten minutes)
    wait_for(lambda: db_now() >= lapses_at, timeout=60, what="the lease lapse")
    taken = task_services.task_lease_acquire(
        tenant=world.tenant,
        task_id=task.pk,
        owner="worker-b",
        actor=world.actor,
        ttl_s=600,
    )
    assert taken.lease_token > planned.lease_token

    # And the settle job, on the true clock, settles the call by the desk's receipt
    # as soon as the database's deadline has passed
    def verified() -> bool:
        check_receipts_job(limit=10)
        return Operation.objects.get(pk=planned.operation_id).state == "verified"

    wait_for(verified, timeout=60, what="the settle job")
    assert world.desk.effects()["by_idempotency_key"][planned.key] == 1
    verdict = check(views=operation_views(world.tenant.pk), tickets=world.tickets())
    assert verdict.problems() == {}, verdict.problems()
