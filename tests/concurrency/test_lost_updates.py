"""R06: P client processes race on one task's ``state_version`` for D seconds over
the REST API of a real gunicorn; no update is lost.

The counter is the task's own version. The state machine has no move from a state
back to itself, and a lease is handed back whenever a task leaves ``running``, so a
client's loop is the task's cycle: read the task; if it is ``running``, move it to
``pending`` with the version and lease token it read; if it is ``pending``, take
the lease, then move it to ``running`` with the version it read. Every process that
read the same ``running`` version races the others to the same write; the losers
get ``409 STALE_STATE`` (or ``LEASE_EXPIRED``: the winner's move handed the lease
back) and re-read. A lease taken by another client first is ``409 LEASE_HELD``.

Invariants: the task's final version is its first plus the number of ``2xx``
transitions, as is the number of ``task.transitioned`` events; the versions the
``2xx`` answers report are unique and contiguous; no ``5xx``.

CI: P=8, D=10 s. ``PORTAL_R06_PROCESSES=16 PORTAL_R06_SECONDS=300`` is the nightly.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.models import Agent, Tenant
from tasks.models import Task
from tests.http.conftest import Server
from tests.http.test_idempotency_race import two_workers

__all__ = ["two_workers"]  # the real gunicorn of the idempotency race (2 workers)

PROCESSES = int(os.environ.get("PORTAL_R06_PROCESSES", "8"))
SECONDS = float(os.environ.get("PORTAL_R06_SECONDS", "10"))
RETRYABLE = {"STALE_STATE", "LEASE_EXPIRED", "LEASE_HELD"}


def _client(
    base_url: str, secret: str, task_id: str, name: str, barrier: Any, out: Any
) -> None:
    """One client process: read, write with the version read, re-read on 409."""
    writes: list[tuple[int, int]] = []  # (version reported, failed tries before it)
    codes: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    tries = 0
    path = f"/api/v1/tasks/{task_id}"
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=60
    ) as http:
        barrier.wait(timeout=120)
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            task = http.get(path).json()
            if task["state"] == "pending":
                leased = http.post(f"{path}/lease", json={"owner": name, "ttl_s": 60})
                statuses[leased.status_code] += 1
                if leased.status_code != 200:
                    codes[leased.json()["code"]] += 1
                    tries += 1
                    continue
                task, to = leased.json(), "running"
            else:
                to = "pending"
            moved = http.post(
                f"{path}/transitions",
                json={"to": to, "expected_state_version": task["state_version"]},
                headers={"Lease-Token": str(task["lease"]["token"])},
            )
            statuses[moved.status_code] += 1
            if 200 <= moved.status_code < 300:
                writes.append((moved.json()["state_version"], tries))
                tries = 0
            else:
                codes[moved.json().get("code", str(moved.status_code))] += 1
                tries += 1
    out.put((writes, codes, statuses))


@pytest.mark.slow  # its own gunicorn and client processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(int(SECONDS) + 300)  # the suite's 300 s is for D=10 s
def test_racing_writers_lose_no_update(two_workers: Server) -> None:
    tenant = Tenant.objects.create(slug=f"r06-{uuid.uuid4().hex[:8]}", name="R06")
    agent = Agent.objects.create(tenant=tenant, name="r06-agent")
    secret = portal_services.agent_key_issue(agent=agent).secret
    registered = httpx.post(
        f"{two_workers.base_url}/api/v1/tasks",
        json={
            "client_task_id": "r06",
            "workflow_key": "w",
            "workflow_version": "1",
            "object_type": "o",
            "object_id": "1",
            "object_version": "1",
        },
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert registered.status_code == 201, registered.text
    task_id, first = registered.json()["id"], registered.json()["state_version"]

    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(PROCESSES)
    out = context.Queue()
    clients = [
        context.Process(
            target=_client,
            args=(two_workers.base_url, secret, task_id, f"c{n}", barrier, out),
        )
        for n in range(PROCESSES)
    ]
    for client in clients:
        client.start()
    results = [out.get(timeout=SECONDS + 600) for _ in clients]
    for client in clients:
        client.join(timeout=60)
        assert client.exitcode == 0

    writes = [write for mine, _, _ in results for write in mine]
    codes: Counter[str] = sum((c for _, c, _ in results), Counter())
    statuses: Counter[int] = sum((s for _, _, s in results), Counter())
    assert not any(status >= 500 for status in statuses), statuses
    assert set(codes) <= RETRYABLE, codes
    final = Task.objects.get(pk=task_id).state_version
    versions = sorted(version for version, _ in writes)
    assert final - first == len(writes)
    assert versions == list(range(first + 1, final + 1))  # unique and contiguous
    transitioned = Event.objects.filter(
        task_id=task_id, code=EventCode.TASK_TRANSITIONED
    ).count()
    assert transitioned == len(writes)

    retries = sorted(tries for _, tries in writes)
    p99 = retries[min(len(retries) - 1, int(len(retries) * 0.99))] if retries else 0
    attempts = len(writes) + codes["STALE_STATE"] + codes["LEASE_EXPIRED"]
    print(
        f"R06 P={PROCESSES} D={SECONDS:.0f}s: N={len(writes)} writes,"
        f" STALE_STATE {codes['STALE_STATE']} ({codes['STALE_STATE'] / attempts:.0%}"
        f" of transitions), LEASE_EXPIRED {codes['LEASE_EXPIRED']},"
        f" LEASE_HELD {codes['LEASE_HELD']}, retries per write p99 {p99},"
        f" lost 0, statuses {dict(statuses)}"
    )
