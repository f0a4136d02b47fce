"""A lost database connection is a 503 problem+json with Retry-After, never a 500,
and the next requests still run in their own tenant's scope (issue 25, R13).

A real gunicorn (one worker, so every request goes through the same process) and
real sessions: an administrator's connection holds a lock the request's first
statement waits for (the rate-limit counter), finds the worker's session waiting,
and ends it with ``pg_terminate_backend`` mid-request. PostgreSQL itself is not
restarted (it is shared); the restart variant is the fault tier's.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from portal import services as portal_services
from portal.models import Agent, AgentRequestWindow, Membership, Role, Tenant
from tasks.models import Task, TaskState

from .conftest import Server, start, stop

WAIT_S = 30.0


@pytest.fixture(scope="module")
def one_worker(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log_path = tmp_path_factory.mktemp("gunicorn") / "server.log"
    running = start(debug=False, log_path=log_path, workers=1)
    try:
        yield running
    finally:
        stop(running)
    assert "Traceback" not in running.log(), running.log()[-5000:]


def _tenant_with_task(name: str) -> tuple[str, str]:
    """A tenant, its agent's key and one task; returns (secret, task id)."""
    tenant = Tenant.objects.create(slug=f"{name}-{uuid.uuid4().hex[:8]}", name=name)
    agent = Agent.objects.create(tenant=tenant, name=f"{name}-agent")
    secret = portal_services.agent_key_issue(agent=agent).secret
    task = Task.objects.create(
        tenant=tenant,
        state=TaskState.PENDING,
        client_task_id=f"{name}-task",
        registration_hash="0" * 64,
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id=name,
        object_version="1",
    )
    return secret, str(task.pk)


def _admin() -> psycopg.Connection:
    """A superuser session on the test database (not the app role)."""
    return psycopg.connect(
        settings.DATABASE_URL, dbname=connection.settings_dict["NAME"], autocommit=True
    )


def _kill_the_waiting_request(admin: psycopg.Connection) -> int:
    """Ends the session that waits for the lock; returns its pid."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).fetchone()
        if row:
            admin.execute("SELECT pg_terminate_backend(%s)", [row[0]])
            return int(row[0])
        time.sleep(0.05)
    raise AssertionError("no request waited for the lock")


def _answer_when_terminated(
    lock: str, send: Callable[[], httpx.Response]
) -> httpx.Response:
    """``send``'s answer when its first statement waits behind ``lock`` (taken by
    an administrator's transaction) and its backend is terminated meanwhile."""
    holder, killer = _admin(), _admin()
    answers: list[httpx.Response] = []
    try:
        holder.execute("BEGIN")
        holder.execute(lock)
        request = threading.Thread(target=lambda: answers.append(send()))
        request.start()
        _kill_the_waiting_request(killer)
        holder.execute("ROLLBACK")
        request.join(timeout=WAIT_S)
    finally:
        holder.close()
        killer.close()
    (answer,) = answers
    return answer


def _assert_retryable_503(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "DATABASE_UNAVAILABLE"
    assert int(answer.headers["retry-after"]) >= 1


def _list(server: Server, secret: str) -> httpx.Response:
    return httpx.get(
        f"{server.base_url}/api/v1/tasks",
        headers={"Authorization": f"Bearer {secret}"},
        timeout=WAIT_S,
    )


@pytest.mark.django_db(transaction=True)
def test_a_lost_connection_is_a_503_and_each_tenant_keeps_its_scope(
    one_worker: Server,
) -> None:
    # Given two tenants, each with one task, served by one gunicorn worker
    tenants = [_tenant_with_task("red"), _tenant_with_task("blue")]
    table = AgentRequestWindow._meta.db_table
    for round_ in range(4):
        victim_secret, _ = tenants[round_ % 2]
        # When the worker's session is terminated while a request waits in it
        lost = _answer_when_terminated(
            f"LOCK TABLE {table} IN EXCLUSIVE MODE",
            functools.partial(_list, one_worker, victim_secret),
        )
        # Then that request is a retryable 503 problem, not a 500
        _assert_retryable_503(lost)
        # And after reconnecting each tenant sees its own task and nothing else
        for secret, task_id in tenants:
            probe = _list(one_worker, secret)
            assert probe.status_code == 200, probe.text
            assert [t["id"] for t in probe.json()["results"]] == [task_id]


@pytest.mark.django_db(transaction=True)
def test_a_lost_connection_before_the_view_is_a_503_for_a_signed_in_person(
    one_worker: Server,
) -> None:
    """A person's request loads its session, user and tenants in the middleware,
    before any view: a connection lost there is the same retryable 503."""
    # Given a support member of one tenant, signed in (a real session row)
    tenant = Tenant.objects.create(slug=f"desk-{uuid.uuid4().hex[:8]}", name="Desk")
    person = User.objects.create_user(f"sam-{uuid.uuid4().hex[:6]}", password="x-pw-1")
    Membership.objects.create(tenant=tenant, user=person, role=Role.SUPPORT)
    browser = Client()
    browser.force_login(person)
    cookies = {"sessionid": browser.cookies["sessionid"].value}
    queue = f"{one_worker.base_url}/api/v1/takeover/queue"

    # When the worker's session is terminated while the session row is read
    lost = _answer_when_terminated(
        "LOCK TABLE django_session IN ACCESS EXCLUSIVE MODE",
        lambda: httpx.get(queue, cookies=cookies, timeout=WAIT_S),
    )
    # Then it is a retryable 503 problem, not a 500
    _assert_retryable_503(lost)
    # And the next request, on a new connection, is the person's queue
    again = httpx.get(queue, cookies=cookies, timeout=WAIT_S)
    assert again.status_code == 200, again.text
