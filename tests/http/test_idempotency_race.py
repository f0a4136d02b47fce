"""Idempotency-Key races against real server processes (issue 25, R01).

A real gunicorn with two worker processes. For each of K keys, C client *processes*
wait on one barrier and then POST the same task registration under the same
``Idempotency-Key`` at once. In the abandon-and-retry variant half of them give up
after 50 ms (the request goes on in the server) and send it again at once. Each
client repeats until it has a final answer, waiting a moment after each ``409``.

Per key: exactly one first answer (``201``, no ``Idempotent-Replayed``), every other
final answer the replay of it (same task, ``Idempotent-Replayed: true``), every
``409`` is ``REQUEST_IN_FLIGHT`` with ``Retry-After``, no 5xx, one task row.

CI size: 10 keys x 8 clients; ``PORTAL_RACE_KEYS=100 PORTAL_RACE_CLIENTS=16`` by hand.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from portal import services as portal_services
from portal.models import Agent, Tenant
from tasks.models import Task

from .conftest import Server, start, stop

KEYS = int(os.environ.get("PORTAL_RACE_KEYS", "10"))
CLIENTS = int(os.environ.get("PORTAL_RACE_CLIENTS", "8"))
ABANDON_S = 0.05


@pytest.fixture(scope="module")
def two_workers(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log_path: Path = tmp_path_factory.mktemp("gunicorn") / "server.log"
    server = start(debug=False, log_path=log_path, workers=2)
    try:
        yield server
    finally:
        stop(server)
    assert "Traceback" not in server.log(), server.log()[-5000:]


def _client(
    base_url: str,
    secret: str,
    keys: list[str],
    abandon: bool,
    barrier: Any,
    out: Any,
) -> None:
    """One client process: each key, at the barrier, until a final answer."""
    answers: list[tuple[str, int | str, Any, Any, Any]] = []
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {secret}"}
    ) as http:
        for key in keys:
            body = {
                "client_task_id": key,
                "workflow_key": "customer-issue",
                "workflow_version": "1",
                "object_type": "customer_issue",
                "object_id": key,
                "object_version": "1",
            }
            barrier.wait(timeout=120)
            timeout = ABANDON_S if abandon else 60.0
            while True:
                try:
                    reply = http.post(
                        "/api/v1/tasks",
                        json=body,
                        headers={"Idempotency-Key": key},
                        timeout=timeout,
                    )
                except httpx.TimeoutException:
                    answers.append((key, "abandoned", None, None, None))
                    timeout = 60.0  # retry at once, and wait for the answer
                    continue
                code = reply.json().get("code") if reply.status_code >= 400 else None
                answers.append(
                    (
                        key,
                        reply.status_code,
                        reply.headers.get("Idempotent-Replayed"),
                        reply.headers.get("Retry-After") or code,
                        reply.json().get("id") if reply.status_code < 300 else code,
                    )
                )
                if reply.status_code != 409:
                    break
                time.sleep(0.05)  # a moment, not Retry-After: keeps the race tight
    out.put(answers)


@pytest.mark.slow  # its own gunicorn and client processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("abandon", [False, True], ids=["together", "abandon-retry"])
def test_one_effect_per_key_under_concurrent_clients(
    two_workers: Server, abandon: bool
) -> None:
    tenant = Tenant.objects.create(slug=f"race-{uuid.uuid4().hex[:8]}", name="Race")
    agent = Agent.objects.create(tenant=tenant, name="race-agent")
    secret = portal_services.agent_key_issue(agent=agent).secret
    keys = [
        f"race-{'a' if abandon else 't'}-{uuid.uuid4().hex[:8]}" for _ in range(KEYS)
    ]
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(CLIENTS)
    out = context.Queue()
    clients = [
        context.Process(
            target=_client,
            args=(
                two_workers.base_url,
                secret,
                keys,
                abandon and n % 2 == 0,
                barrier,
                out,
            ),
        )
        for n in range(CLIENTS)
    ]
    began = time.monotonic()
    for client in clients:
        client.start()
    answers = [answer for _ in clients for answer in out.get(timeout=600)]
    for client in clients:
        client.join(timeout=60)
        assert client.exitcode == 0
    took = time.monotonic() - began

    statuses = Counter(a[1] for a in answers)
    assert not any(isinstance(s, int) and s >= 500 for s in statuses), statuses
    for key in keys:
        mine = [a for a in answers if a[0] == key]
        final = [a for a in mine if a[1] not in (409, "abandoned")]
        firsts = [a for a in final if a[2] != "true"]
        # Abandoned first deliveries are answered to nobody: then all are replays.
        assert len(firsts) <= 1, mine
        assert {a[1] for a in final} == {201}, mine
        assert len({a[4] for a in final}) == 1, mine  # one task, the same for all
        in_flight = [a for a in mine if a[1] == 409]
        assert all(a[3] == "1" for a in in_flight), in_flight  # Retry-After: 1
        if not abandon:
            assert len(firsts) == 1, mine
    rows = Counter(
        Task.objects.filter(tenant=tenant).values_list("client_task_id", flat=True)
    )
    assert rows == Counter(dict.fromkeys(keys, 1))
    print(
        f"{KEYS} keys x {CLIENTS} clients ({'abandon' if abandon else 'together'}):"
        f" {dict(statuses)}, {took:.1f} s"
    )
