"""R05: a worker paused (SIGSTOP) past its lease is fenced when it resumes.

The classic way a lease breaks: a process holding it stops (a GC pause, a VM
migration, SIGSTOP), the lease lapses, someone else takes the task over, and the
paused process wakes up believing it still holds it. Here the process is real
(``tests/support/gateway_child.py``, the gateway under the agent's lease token) and
so is the pause: it renews its lease for a few seconds, runs the gateway and sends
itself SIGSTOP at a named point; the kernel keeps it stopped until the test sends
SIGCONT. Meanwhile the lease lapses on the database's clock and another worker
acquires it (a higher fencing token).

Three points, three fences:

- paused **before the call**, the new holder only holds the lease: the resumed
  process's ``executing`` move is refused by the lease (``LEASE_EXPIRED``);
- paused **before the call**, the new holder executed the operation: the resumed
  process finds the operation's ``state_version`` moved and only reports it;
- paused **after the call** (the desk made the ticket, nothing recorded): the
  settle job settles it by the receipt; the resumed process's record of the call is
  refused by the version (``STALE_STATE``) and rolled back.

Each ends with one ticket at the desk for the key (the desk's own count), the
operation ``verified`` with that ticket's id, and not one row or event written by the
resumed process. The last test does the same to a Celery worker node on the queued
path, stopped while its job waits for the desk.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from kombu import Connection

from config.celery import app
from portal.db import db_now
from tasks import gateway
from tasks import services as task_services
from tasks.jobs import check_receipts_job, run_operation_job
from tasks.models import Operation, Task

from .conftest import World
from .harness import WorkerPool, check, operation_views
from .processes import start_child, wait_for

# The lease the paused process renews before it runs: it lapses during the pause.
LEASE_TTL_S = 4.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]


def _footprint(world: World, operation_id: Any) -> dict[str, Any]:
    """What a late write would change: the rows and the number of events."""
    operation = Operation.objects.get(tenant=world.tenant, pk=operation_id)
    task = Task.objects.get(tenant=world.tenant, pk=operation.task_id)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM audit_event WHERE tenant_id = %s", [world.tenant.pk]
        )
        (events,) = cursor.fetchone()
    return {
        "operation": (operation.state, operation.state_version, operation.attempts),
        "task": (task.state, task.state_version, task.lease_token, task.lease_owner),
        "events": events,
    }


def _lease_lapsed(task_id: Any) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT lease_expires_at <= app_now() FROM tasks_task WHERE id = %s",
            [task_id],
        )
        (lapsed,) = cursor.fetchone()
    return bool(lapsed)


@pytest.mark.parametrize(
    ("stop_at", "takeover"),
    [
        ("before_call", "holds"),
        ("before_call", "executes"),
        ("after_call", "settles"),
    ],
)
def test_a_worker_paused_past_its_lease_is_fenced_when_it_resumes(
    world: World, stop_at: str, takeover: str
) -> None:
    # Given a reserved create_ticket under a running task, and a worker process that
    # renewed the task's lease for 4 s and stopped itself inside the gateway
    planned = world.plan(0)
    task_id = Operation.objects.get(pk=planned.operation_id).task_id
    child = start_child(world, planned, lease_ttl_s=LEASE_TTL_S, stop_at=stop_at)
    try:
        child.wait_stopped()
        stopped_at = time.monotonic()
        called = world.desk.effects()["by_idempotency_key"].get(planned.key, 0)
        assert called == (1 if stop_at == "after_call" else 0)
        # When its lease lapses on the database's clock and another worker takes over
        wait_for(
            lambda: _lease_lapsed(task_id), timeout=LEASE_TTL_S + 60, what="the lapse"
        )
        taken = task_services.task_lease_acquire(
            tenant=world.tenant,
            task_id=task_id,
            owner="worker-b",
            actor=world.actor,
            ttl_s=600,
        )
        assert taken.lease_token > planned.lease_token
        if takeover == "executes":
            result = gateway.operation_execute(
                tenant=world.tenant,
                operation_id=planned.operation_id,
                lease_token=taken.lease_token,
                fields=world.fields(db_now()),
                actor=world.actor,
            )
            assert result.outcome == "verified", (result.outcome, result.reason)
        if takeover == "settles":
            # The settle job (celery beat's) looks the receipt up once the in-doubt
            # deadline has passed: the desk's ticket settles it.
            def verified() -> bool:
                check_receipts_job(limit=10)
                operation = Operation.objects.get(pk=planned.operation_id)
                return operation.state == "verified"

            wait_for(verified, timeout=60, what="the settle job")
        before = _footprint(world, planned.operation_id)
        # And the paused process is resumed
        paused_for = time.monotonic() - stopped_at
        os.kill(child.pid, signal.SIGCONT)
        output = child.finish()
    finally:
        child.kill()
    printed = child.lines(output)
    # Then its late writes were refused, and it wrote nothing at all
    expected = {
        "holds": ({"refused": "LEASE_EXPIRED"}, 3),
        "executes": ({"outcome": "verified", "reason": None}, 0),
        "settles": ({"refused": "STALE_STATE"}, 3),
    }[takeover]
    assert (printed[-1], child.process.returncode) == expected, output
    assert _footprint(world, planned.operation_id) == before
    if takeover == "holds":
        # The holder of the lease executes: the first call for the key
        assert world.desk.effects()["by_idempotency_key"].get(planned.key, 0) == 0
        result = gateway.operation_execute(
            tenant=world.tenant,
            operation_id=planned.operation_id,
            lease_token=taken.lease_token,
            fields=world.fields(db_now()),
            actor=world.actor,
        )
        assert result.outcome == "verified", (result.outcome, result.reason)
    # And the desk made exactly one ticket for the key, the one the operation names
    assert world.desk.effects()["by_idempotency_key"][planned.key] == 1
    verdict = check(views=operation_views(world.tenant.pk), tickets=world.tickets())
    assert verdict.problems() == {}, verdict.problems()
    print(f"paused {paused_for:.1f} s at {stop_at}; taken over ({takeover})")


def test_a_celery_worker_paused_mid_call_is_fenced_when_it_resumes(
    world: World,
    make_workers: Callable[[int], WorkerPool],
    chaos_queue: str,
    amqp_url: str,
) -> None:
    """The queued path: a ``celery -A portal worker`` node (main process and pool
    children, one process group) is stopped while its job waits for the desk, which
    makes the ticket after 3 s ("slow"). The agent's lease lapses, another worker
    takes the task over, and the settle job settles the call by the desk's receipt;
    on SIGCONT the job reads the desk's answer and its record is refused by the
    operation's version (``STALE_STATE``): the same footprint, one ticket."""
    # Given an execution queued under the agent's lease, a lease about to lapse,
    # and a desk that answers the create after 3 s
    planned = world.plan(0)
    task_id = Operation.objects.get(pk=planned.operation_id).task_id
    world.queue_execution(planned)
    pool = make_workers(1)
    pool.start_all()
    [slot] = pool.slots
    assert slot.process is not None
    world.desk.set_fault("slow", delay_s=3.0)
    task_services.task_lease_renew(
        tenant=world.tenant,
        task_id=task_id,
        lease_token=planned.lease_token,
        ttl_s=1,
    )
    requests = world.desk.effects()["create_requests"]
    with Connection(amqp_url) as broker:
        run_operation_job.apply_async(
            kwargs={
                "tenant_id": str(world.tenant.pk),
                "operation_id": str(planned.operation_id),
            },
            queue=chaos_queue,
            task_id=str(planned.operation_id),
            producer=app.amqp.Producer(broker),
        )
    # When the worker is stopped while its call waits for the desk
    wait_for(
        lambda: world.desk.effects()["create_requests"] > requests,
        timeout=60,
        what="the worker's call",
    )
    group = os.getpgid(slot.process.pid)
    os.killpg(group, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        wait_for(lambda: _lease_lapsed(task_id), timeout=60, what="the lease to lapse")
        taken = task_services.task_lease_acquire(
            tenant=world.tenant,
            task_id=task_id,
            owner="worker-b",
            actor=world.actor,
            ttl_s=600,
        )
        assert taken.lease_token > planned.lease_token

        def verified() -> bool:
            check_receipts_job(limit=10)
            operation = Operation.objects.get(pk=planned.operation_id)
            return operation.state == "verified"

        wait_for(verified, timeout=60, what="the settle job")
        before = _footprint(world, planned.operation_id)
        paused_for = time.monotonic() - stopped_at
    finally:
        os.killpg(group, signal.SIGCONT)
    # Then the resumed job's record is refused and it writes nothing
    wait_for(
        lambda: "StaleState" in pool.tail(slot, lines=200),
        timeout=60,
        what="the resumed job's refusal",
    )
    assert _footprint(world, planned.operation_id) == before
    assert world.desk.effects()["by_idempotency_key"][planned.key] == 1
    verdict = check(views=operation_views(world.tenant.pk), tickets=world.tickets())
    assert verdict.problems() == {}, verdict.problems()
    print(f"celery worker paused {paused_for:.1f} s mid-call")
