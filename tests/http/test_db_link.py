"""The web server ↔ PostgreSQL link under network faults (issue 25, R15).

A real gunicorn whose every database connection goes through a TCP fault proxy
(tests/support/faultproxy.py) to the shared PostgreSQL, which itself is never
touched. While agents register tasks, the proxy adds latency, resets every
connection, and partitions the link so that no new connection can be made. Every
answer is a success or a retryable 503 problem+json with ``Retry-After``; a request
that cannot reach the database answers within the connect timeout
(``PORTAL_DB_CONNECT_TIMEOUT_S``) + 1 s; every registration answered 201 is in the
database, and a retry of one answered 503 (same ``client_task_id``) makes it exist
exactly once: nothing lost, nothing twice.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.db import connection

from portal import services as portal_services
from portal.models import Agent, Tenant
from tasks.models import Task
from tests.fault.harness import database_url
from tests.support.faultproxy import FaultProxy

from .conftest import Server, start, stop

CONNECT_TIMEOUT_S = 2  # libpq's smallest
CLIENTS = 4


@pytest.fixture(scope="module")
def linked(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, FaultProxy]]:
    settings_dict = connection.settings_dict
    upstream = (
        settings_dict["HOST"] or "127.0.0.1",
        int(settings_dict["PORT"] or 5432),
    )
    with FaultProxy(upstream) as proxy:
        direct = database_url()
        through = direct.replace(
            f"{upstream[0]}:{upstream[1]}", f"127.0.0.1:{proxy.port}"
        )
        assert through != direct
        log_path: Path = tmp_path_factory.mktemp("gunicorn") / "server.log"
        server = start(
            debug=False,
            log_path=log_path,
            workers=2,
            env_extra={
                "DATABASE_URL": through,
                "PORTAL_DB_CONNECT_TIMEOUT_S": str(CONNECT_TIMEOUT_S),
            },
        )
        try:
            yield server, proxy
        finally:
            stop(server)
    assert "Traceback" not in server.log(), server.log()[-5000:]


def _agent_secret() -> str:
    tenant = Tenant.objects.create(slug=f"link-{uuid.uuid4().hex[:8]}", name="Link")
    agent = Agent.objects.create(tenant=tenant, name="link-agent")
    return portal_services.agent_key_issue(agent=agent).secret


def _register(server: Server, secret: str, client_task_id: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/tasks",
        headers={"Authorization": f"Bearer {secret}"},
        json={
            "client_task_id": client_task_id,
            "workflow_key": "customer-issue",
            "workflow_version": "1",
            "object_type": "customer_issue",
            "object_id": client_task_id,
            "object_version": "1",
        },
        timeout=60,
    )


def _retryable(answer: httpx.Response) -> bool:
    return (
        answer.status_code == 503
        and answer.headers["content-type"] == "application/problem+json"
        and int(answer.headers["retry-after"]) >= 1
    )


@pytest.mark.slow  # its own gunicorn; over 20 s on the shared machine
@pytest.mark.django_db(transaction=True)
def test_resets_and_a_partition_are_bounded_503s_and_nothing_is_lost(
    linked: tuple[Server, FaultProxy],
) -> None:
    server, proxy = linked
    secret = _agent_secret()
    proxy.latency_s = 0.005  # every round trip to the database is slower
    accepted_before = proxy.accepted
    answers: dict[str, list[httpx.Response]] = {}
    stop_at = time.monotonic() + 4

    def agent(n: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            key = f"link-{n}-{i}"
            answers[key] = [_register(server, secret, key)]
            i += 1

    clients = [threading.Thread(target=agent, args=(n,)) for n in range(CLIENTS)]
    for client in clients:
        client.start()
    # While the agents register: every connection reset, twice.
    for _ in range(2):
        time.sleep(1.2)
        proxy.reset()
    for client in clients:
        client.join()
    # The web workers reconnected through the link after each reset.
    assert proxy.accepted > accepted_before

    # The link partitioned: open connections cut, no new one can be made.
    proxy.partition(True)
    proxy.reset()
    began = time.monotonic()
    cut = _register(server, secret, "link-partitioned")
    took = time.monotonic() - began
    assert _retryable(cut), (cut.status_code, cut.text)
    assert cut.json()["code"] == "DATABASE_UNAVAILABLE"
    assert took <= CONNECT_TIMEOUT_S + 1, took
    answers["link-partitioned"] = [cut]
    proxy.partition(False)
    proxy.latency_s = 0

    # Every answer was a registration or a retryable 503, and a retry settles each.
    for key, (first,) in answers.items():
        assert first.status_code in (200, 201) or _retryable(first), (
            key,
            first.status_code,
            first.text,
        )
        if first.status_code == 503:
            again = _register(server, secret, key)
            assert again.status_code in (200, 201), again.text
            answers[key].append(again)
    registered = set(
        Task.objects.filter(client_task_id__startswith="link-").values_list(
            "client_task_id", flat=True
        )
    )
    assert registered == set(answers)
    assert Task.objects.filter(client_task_id__startswith="link-").count() == len(
        answers
    )
    lost = sum(1 for replies in answers.values() if replies[0].status_code == 503)
    print(f"{len(answers)} registrations, {lost} answered 503 first")
