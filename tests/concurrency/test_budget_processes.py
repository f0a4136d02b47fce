"""Limits, budgets and the kill switch under parallel agents, against a real gunicorn
with four worker processes: PostgreSQL is the one counter they share (docs/limits.md).

Eight HTTP clients (threads here; the parallelism that matters is the server's four
processes, each with its own database connection) reserve against one budget, one
rate limit and the API's request throttle; then one of eight busy agents is frozen
and the time from the freeze's commit to its last accepted call is measured.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.db import connection

from audit.models import Event, EventCode
from limits import services as limits_services
from limits.models import Budget, LimitUsage, RateLimit
from portal import scope
from portal import services as portal_services
from portal.models import Agent, Tenant
from tasks.models import Task, TaskState
from tests.http.conftest import Server, start, stop

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 8


def _server(tmp_path_factory: pytest.TempPathFactory, rate: str) -> Iterator[Server]:
    log_path = tmp_path_factory.mktemp("gunicorn") / "server.log"
    server = start(
        debug=False,
        log_path=log_path,
        workers=4,
        env_extra={"PORTAL_AGENT_RATE_LIMIT": rate},
    )
    try:
        yield server
    finally:
        stop(server)
    assert "Traceback" not in server.log(), server.log()[-5000:]


@pytest.fixture(scope="module")
def server(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from _server(tmp_path_factory, "1000000/min")


@pytest.fixture(scope="module")
def throttled_server(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from _server(tmp_path_factory, "5/min")


def _key(agent: Agent) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {portal_services.agent_key_issue(agent=agent).secret}"
    }


def _in_parallel(work: Callable[[int], Any], n: int = CLIENTS) -> list[Any]:
    """``work(i)`` on n threads released together; their results in order."""
    barrier = threading.Barrier(n, timeout=30)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        results[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def _reserve(
    http: httpx.Client,
    base: str,
    headers: dict[str, str],
    task: Task,
    key: str,
    **input: Any,
) -> httpx.Response:
    return http.post(
        f"{base}/api/v1/tasks/{task.pk}/operations",
        json={"idempotency_key": key, "action": "a", "target": "desk", "input": input},
        headers={**headers, "Lease-Token": str(task.lease_token)},
        timeout=30,
    )


def _clear_of_window_end(window_s: int, margin_s: float = 5.0) -> None:
    """Wait out the end of the current fixed window if it is near (database clock)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT %s - extract(epoch FROM app_now())::numeric %% %s",
            [window_s, window_s],
        )
        (left,) = cursor.fetchone()
    if float(left) < margin_s:
        time.sleep(float(left) + 0.5)


def test_eight_clients_never_overspend_a_budget(server, tenant, agent, make_task):
    # given a budget of 100 and eight clients with a running task each
    budget = Budget.objects.create(
        tenant=tenant, agent=agent, action="a", argument="amount", max_total=100
    )
    headers = _key(agent)
    tasks = [make_task(state=TaskState.RUNNING, leased=True, lease_seconds=300)
             for _ in range(CLIENTS)]  # fmt: skip

    # when each asks five times for 7 (280 in all) at once
    def spend(i: int) -> list[int]:
        with httpx.Client() as http:
            return [
                _reserve(http, server.base_url, headers, tasks[i], f"r-{i}-{n}",
                         amount=7).status_code
                for n in range(5)
            ]  # fmt: skip

    statuses = [s for result in _in_parallel(spend) for s in result]
    # then exactly 14 are accepted (98), the rest refused, and the counter agrees
    assert statuses.count(201) == 14
    assert statuses.count(422) == CLIENTS * 5 - 14
    (usage,) = LimitUsage.objects.filter(budget=budget)
    assert usage.used == Decimal(98)
    assert (
        Event.objects.filter(tenant=tenant, reason_code="BUDGET_EXCEEDED").count() == 26
    )


def test_eight_clients_get_exactly_a_rate_limits_calls(
    server, tenant, agent, make_task
):
    RateLimit.objects.create(tenant=tenant, agent=agent, action="a", max_calls=5,
                             window_s=3600)  # fmt: skip
    headers = _key(agent)
    tasks = [make_task(state=TaskState.RUNNING, leased=True, lease_seconds=300)
             for _ in range(CLIENTS)]  # fmt: skip
    _clear_of_window_end(3600)

    def call(i: int) -> list[int]:
        with httpx.Client() as http:
            return [_reserve(http, server.base_url, headers, tasks[i], f"k-{i}-{n}").status_code
                    for n in range(4)]  # fmt: skip

    statuses = [s for result in _in_parallel(call) for s in result]
    assert statuses.count(201) == 5
    assert statuses.count(429) == CLIENTS * 4 - 5


def test_the_api_throttle_is_shared_by_four_workers(throttled_server, tenant, agent):
    """5/min with 4 workers: exactly 5 of 30 requests pass (it was 18 per process)."""
    headers = _key(agent)
    _clear_of_window_end(60)

    def call(i: int) -> list[int]:
        with httpx.Client() as http:
            return [
                http.get(f"{throttled_server.base_url}/api/v1/tasks", headers=headers,
                         timeout=30).status_code
                for _ in range(4 if i < 6 else 3)
            ]  # fmt: skip

    statuses = [s for result in _in_parallel(call) for s in result]
    assert len(statuses) == 30
    assert statuses.count(200) == 5
    assert statuses.count(429) == 25


def test_a_frozen_agents_next_call_is_refused_within_a_second_under_load(
    server, tenant: Tenant, make_agent
):
    # given eight agents calling as fast as they can, one task leased to agent 0
    agents = [make_agent(tenant=tenant) for _ in range(CLIENTS)]
    headers = [_key(agent) for agent in agents]
    with httpx.Client() as http:
        task = http.post(
            f"{server.base_url}/api/v1/tasks",
            json={"client_task_id": "t-1", "workflow_key": "w", "workflow_version": "1",
                  "object_type": "o", "object_id": "1", "object_version": "1"},
            headers=headers[0],
        ).json()  # fmt: skip
        leased = http.post(
            f"{server.base_url}/api/v1/tasks/{task['id']}/lease",
            json={"owner": "worker-0"},
            headers=headers[0],
        )
        assert leased.status_code == 200, leased.text
    stop_at = time.monotonic() + 4.0
    frozen_at: list[float] = []
    calls: list[list[tuple[float, float, int, str]]] = [[] for _ in range(CLIENTS)]

    def work(i: int) -> None:
        with httpx.Client() as http:
            while time.monotonic() < stop_at:
                sent = time.monotonic()
                response = http.get(f"{server.base_url}/api/v1/tasks", headers=headers[i],
                                    timeout=30)  # fmt: skip
                code = (
                    response.json().get("code", "")
                    if response.status_code != 200
                    else ""
                )
                calls[i].append((sent, time.monotonic(), response.status_code, code))

    def freeze() -> None:
        time.sleep(1.5)
        try:
            with scope.tenant_scope([tenant.pk]):
                limits_services.agent_freeze(tenant=tenant, agent_id=agents[0].pk)
            frozen_at.append(time.monotonic())  # the freeze has committed
        finally:
            connection.close()  # this thread's own connection

    freezer = threading.Thread(target=freeze)
    freezer.start()
    _in_parallel(work)
    freezer.join()
    (t0,) = frozen_at
    # then the last accepted call of the frozen agent ended less than 1 s after the
    # freeze committed, and every call it sent after that was refused by name
    accepted = [done for _, done, status, _ in calls[0] if status == 200]
    last_accepted_after_s = max(accepted) - t0
    print(f"\nlast accepted call {last_accepted_after_s * 1000:.0f} ms after the freeze; "
          f"{sum(len(c) for c in calls)} calls by {CLIENTS} agents")  # fmt: skip
    assert last_accepted_after_s < 1.0
    later = [(status, code) for sent, _, status, code in calls[0] if sent > t0]
    assert later and set(later) == {(403, "AGENT_FROZEN")}
    # the other seven were not stopped
    for i in range(1, CLIENTS):
        assert {status for sent, _, status, _ in calls[i] if sent > t0} == {200}
    # its lease is gone and each refusal is a denial event
    expires_at = Task.objects.get(pk=task["id"]).lease_expires_at
    assert expires_at is not None and expires_at <= dt.datetime.now(dt.UTC)
    denials = Event.objects.filter(tenant=tenant, reason_code="AGENT_FROZEN",
                                   code=EventCode.GATEWAY_CHECKED).count()  # fmt: skip
    refused = [call for call in calls[0] if call[2] == 403]  # some before t0 was read
    assert denials == len(refused)
