"""R08: an ambiguous commit, retried with the same Idempotency-Key, has one effect.

A real gunicorn (one worker) serves the agent API through ``tests/fault/fault_wsgi.py``:
``config.wsgi`` with one armed fault at a named point of ``AgentApi`` after the
service's transaction committed (``portal.api.FAULT_POINTS``): before the answer is
stored under the key, or after it is stored and before it is sent. The request is
parked there on an advisory lock the test holds, and the test then makes it raise,
ends its database session (``pg_terminate_backend``), or SIGKILLs the worker process.

The client is an agent reserving a ``create_ticket`` (``POST /tasks/{id}/operations``)
with an ``Idempotency-Key``: whatever it got (a 500, a 201, a cut connection), it
retries the same request with the same key until it gets a 2xx, honouring
``409 REQUEST_IN_FLIGHT`` and ``503`` (the key stays in flight for
``PORTAL_IDEMPOTENCY_LOCK_S``, 3 s here, when the answer was never stored), and then
once more. Every 2xx names the same operation, the tenant holds exactly one operation
for the business key and one ``operation.reserved`` event.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest
from django.conf import settings
from django.db import connection

from portal import services as portal_services
from portal.api import FAULT_POINTS
from tasks import services as task_services
from tasks.models import Operation
from tests.http.conftest import Server, start, stop
from tests.support.contracts import TARGET

from .conftest import World

LOCK_S = 3  # PORTAL_IDEMPOTENCY_LOCK_S of the server
FAULT_LOCK = 25_008  # the advisory lock a request waits for at the fault point
RETRY_FOR_S = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def arm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fault") / "armed.json"


@pytest.fixture(scope="module")
def fault_server(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory, arm_file: Path
) -> Iterator[Server]:
    log_path = tmp_path_factory.mktemp("gunicorn") / "server.log"
    running = start(
        debug=False,
        log_path=log_path,
        workers=1,
        app="tests.fault.fault_wsgi:application",
        env_extra={
            "PORTAL_FAULT_ARM_FILE": str(arm_file),
            "PORTAL_FAULT_LOCK": str(FAULT_LOCK),
            "PORTAL_IDEMPOTENCY_LOCK_S": str(LOCK_S),
        },
    )
    try:
        yield running
    finally:
        stop(running)


def _admin() -> psycopg.Connection:
    """A superuser session on the test database (not the app role)."""
    return psycopg.connect(
        settings.DATABASE_URL, dbname=connection.settings_dict["NAME"], autocommit=True
    )


def _parked(admin: psycopg.Connection, timeout: float = 30) -> int:
    """The backend pid of the request waiting at the fault point."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE %s AND pid <> pg_backend_pid()",
            ["%pg_advisory_lock%"],
        ).fetchone()
        if row:
            return int(row[0])
        time.sleep(0.05)
    raise AssertionError("no request parked at the fault point")


def _running_task(world: World) -> tuple[uuid.UUID, int]:
    """A registered task, leased by the agent and running: (id, lease token)."""
    object_id = uuid.uuid4().hex[:8]
    task = task_services.task_register(
        tenant=world.tenant,
        actor=world.actor,
        client_task_id=f"ambiguous-{object_id}",
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id=object_id,
        object_version="7",
        contract_key="customer-issue",
    ).task
    task = task_services.task_lease_acquire(
        tenant=world.tenant, task_id=task.pk, owner="agent", actor=world.actor
    )
    task = task_services.task_transition(
        tenant=world.tenant,
        task_id=task.pk,
        to="running",
        expected_version=task.state_version,
        lease_token=task.lease_token,
        actor=world.actor,
    )
    assert task.lease_token is not None
    return task.pk, task.lease_token


def _answer(response: httpx.Response) -> dict[str, Any]:
    return {
        "status": response.status_code,
        "type": response.headers.get("content-type", ""),
        "replayed": response.headers.get("idempotent-replayed") == "true",
        "code": (
            response.json().get("code")
            if response.headers.get("content-type", "").startswith(
                "application/problem+json"
            )
            else None
        ),
        "id": (response.json().get("id") if response.status_code < 300 else None),
        "retry_after": response.headers.get("retry-after"),
    }


@pytest.mark.parametrize("action", ["raise", "terminate", "sigkill"])
@pytest.mark.parametrize("point", FAULT_POINTS)
def test_an_ambiguous_commit_retried_with_the_same_key_has_one_effect(
    world: World, fault_server: Server, arm_file: Path, point: str, action: str
) -> None:
    # Given an agent holding a running task's lease, and a fault armed at the point
    secret = portal_services.agent_key_issue(agent=world.agent).secret
    task_id, token = _running_task(world)
    business_key = f"ticket-{uuid.uuid4().hex[:8]}"
    url = f"{fault_server.base_url}/api/v1/tasks/{task_id}/operations"
    body = {
        "idempotency_key": business_key,
        "action": "create_ticket",
        "target": TARGET,
        "input": {"queue": "billing", "summary": "Refund", "customer": "ana"},
    }
    headers = {
        "Authorization": f"Bearer {secret}",
        "Idempotency-Key": f"req-{uuid.uuid4()}",
        "Lease-Token": str(token),
    }
    answers: list[dict[str, Any]] = []

    def send() -> dict[str, Any]:
        try:
            answer = _answer(httpx.post(url, json=body, headers=headers, timeout=60))
        except httpx.TransportError as error:
            answer = {"status": None, "error": type(error).__name__}
        answers.append(answer)
        return answer

    admin = _admin()
    try:
        admin.execute("SELECT pg_advisory_lock(%s)", [FAULT_LOCK])
        arm_file.write_text(json.dumps({"point": point, "action": action}))
        # When the first delivery commits and is parked at the point, then faulted
        first = threading.Thread(target=send)
        first.start()
        backend = _parked(admin)
        if action == "terminate":
            admin.execute("SELECT pg_terminate_backend(%s)", [backend])
        if action == "sigkill":
            [worker] = psutil.Process(fault_server.process.pid).children()
            os.kill(worker.pid, signal.SIGKILL)
        admin.execute("SELECT pg_advisory_unlock(%s)", [FAULT_LOCK])
        first.join(60)
    finally:
        admin.close()
    assert not arm_file.exists() and arm_file.with_suffix(".fired").exists()
    arm_file.with_suffix(".fired").unlink()
    # And the client retries the same request with the same key until a 2xx
    deadline = time.monotonic() + RETRY_FOR_S
    while answers[-1]["status"] not in (200, 201):
        assert time.monotonic() < deadline, answers
        time.sleep(float(answers[-1].get("retry_after") or 0.5))
        send()
    settled = len(answers)
    # And once more after that, as a client that lost the answer would
    while len(answers) == settled or answers[-1]["status"] not in (200, 201):
        assert time.monotonic() < deadline + RETRY_FOR_S, answers
        if len(answers) > settled:
            time.sleep(float(answers[-1].get("retry_after") or 0.5))
        send()
    print(
        point,
        action,
        [
            (
                a["status"],
                a.get("code")
                or a.get("error")
                or ("replayed" if a.get("replayed") else ""),
            )
            for a in answers
        ],
    )
    # Then every answer was a 2xx naming the one operation, or a retryable refusal
    operations = Operation.objects.filter(
        tenant=world.tenant, idempotency_key=business_key
    )
    assert operations.count() == 1, answers
    operation = operations.get()
    for answer in answers:
        if answer["status"] in (200, 201):
            assert answer["id"] == str(operation.pk), answers
        elif answer["status"] is not None:
            assert answer["type"].startswith("application/problem+json"), answers
            assert answer["status"] in (409, 500, 503), answers
            if answer["status"] == 409:
                assert answer["code"] == "REQUEST_IN_FLIGHT", answers
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM audit_event WHERE tenant_id = %s"
            " AND operation_id = %s AND code = 'operation.reserved'",
            [world.tenant.pk, operation.pk],
        )
        assert cursor.fetchone() == (1,)
    # And an answer stored before the fault is replayed as it was (201)
    if point == "after_answer_stored":
        retried = [a for a in answers[1:] if a["status"] in (200, 201)]
        assert all(a["replayed"] and a["status"] == 201 for a in retried), answers
    if action == "sigkill":
        assert answers[0]["status"] is None, answers  # the connection was cut
    stop_log = fault_server.log()
    assert "Booting worker" in stop_log
