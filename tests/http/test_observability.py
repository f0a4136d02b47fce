"""/metrics, /healthz and /readyz on a real gunicorn, with a real Celery worker.

Gunicorn runs from the repository's ``gunicorn.conf.py`` with several workers that
each retire after a few requests (``--max-requests``), and a Celery worker (prefork)
shares its ``PROMETHEUS_MULTIPROC_DIR``: the counters one scrape reports are the sums
over all of these processes, the dead ones included (docs/observability.md).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery
from django.db import connection, transaction
from prometheus_client.parser import text_string_to_metric_families

from audit import services as audit_services
from audit.models import EventCode
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.models import Tenant
from tasks.models import Task, TaskState
from tests.fault.harness import database_url
from tests.gateway.conftest import World as GatewayWorld
from tests.gateway.conftest import make_world
from tests.support import broker
from tests.support.broker import closed_port, delete_queue
from tests.support.celery_worker import celery_worker_running
from tests.support.db import connect_as
from ticketdesk.harness import TicketDesk

from .conftest import Server, World, start, stop

# Every test: the servers need the test database made, which pytest-django does only
# when a selected test asks for it.
pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "metrics-test-token-" + uuid.uuid4().hex
TASK_ROUTE = "/api/v1/tasks/<uuid:task_id>"
LATENCY = "portal_http_request_duration_seconds_count"


# --- Reading the exposition -----------------------------------------------------------


def sample_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def sample_names(text: str) -> set[str]:
    return {
        sample.name
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def label_values(text: str, name: str, label: str) -> set[str]:
    return {
        sample.labels[label]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and label in sample.labels
    }


def scrape(server: Server, token: str | None = TOKEN) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = httpx.get(f"{server.base_url}/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return answer.text


# --- The servers ----------------------------------------------------------------------

amqp_url = broker.amqp_url  # the shared fixture (tests/support/broker.py)


@pytest.fixture(scope="module")
def metrics_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prometheus-multiproc")


@pytest.fixture(scope="module")
def monitored(
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
    metrics_dir: Path,
    amqp_url: str,
) -> Iterator[Server]:
    """Three workers, each replaced after four requests; the token set."""
    log_path = tmp_path_factory.mktemp("gunicorn") / "server.log"
    server = start(
        debug=False,
        log_path=log_path,
        workers=3,
        extra_args=("--max-requests", "4"),
        env_extra={
            "PORTAL_METRICS_TOKEN": TOKEN,
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "CELERY_BROKER_URL": amqp_url,
        },
        wait_path="/healthz",
    )
    try:
        yield server
    finally:
        stop(server)
    assert "Traceback" not in server.log(), server.log()[-5000:]


@dataclass
class Worker:
    queue: str
    process: subprocess.Popen[str]
    lines: list[str]

    def send(self, amqp_url: str, name: str, **kwargs: Any) -> None:
        from config.celery import app

        with app.connection_for_write(amqp_url) as broker:
            app.send_task(name, kwargs=kwargs, queue=self.queue, connection=broker)


@pytest.fixture(scope="module")
def celery_worker(
    monitored: Server, metrics_dir: Path, amqp_url: str
) -> Iterator[Worker]:
    """A prefork Celery worker on a queue of this module, sharing the metrics folder."""
    queue = f"celery-metrics-{uuid.uuid4().hex[:10]}"
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=amqp_url,
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        PYTHONUNBUFFERED="1",
    )
    prefork = ("--pool", "prefork", "--concurrency", "1")
    try:
        with celery_worker_running(
            queue=queue, env=env, pool=prefork, name="metricstest"
        ) as running:
            yield Worker(queue=queue, process=running.process, lines=running.lines)
    finally:
        delete_queue(amqp_url, queue)


def wait_for(server: Server, name: str, at_least: float, **labels: str) -> str:
    """Scrape until the sample reaches ``at_least`` (a job runs when it runs)."""
    deadline = time.monotonic() + 60
    while True:
        text = scrape(server)
        if sample_sum(text, name, **labels) >= at_least:
            return text
        assert time.monotonic() < deadline, (name, labels, text[-3000:])
        time.sleep(0.3)


# --- /metrics: the token --------------------------------------------------------------


def test_metrics_wants_the_token(monitored: Server) -> None:
    url = f"{monitored.base_url}/metrics"
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
    ):
        answer = httpx.get(url, headers=headers, timeout=10)
        assert answer.status_code == 401, (headers, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert answer.json()["code"] == "UNAUTHENTICATED"
        assert "portal_" not in answer.text
    assert "portal_http_request_duration_seconds" in scrape(monitored)


# --- /metrics: HTTP latency by route, summed across workers ----------------------------


def test_latency_is_counted_by_route_across_workers(
    monitored: Server, world: World, metrics_dir: Path
) -> None:
    before = scrape(monitored)
    labels = {"method": "GET", "route": TASK_ROUTE, "status": "200"}
    # when: 20 reads of one task, over workers that retire after four requests each
    for _ in range(20):
        answer = httpx.get(
            f"{monitored.base_url}/api/v1/tasks/{world.task.pk}",
            headers={"Authorization": world.auth},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    after = scrape(monitored)
    # then the one route's count rose by exactly 20, though no process served them all
    assert sample_sum(after, LATENCY, **labels) - sample_sum(
        before, LATENCY, **labels
    ) == pytest.approx(20)
    writers = {path.stem.rsplit("_", 1)[1] for path in metrics_dir.glob("histogram_*")}
    assert len(writers) >= 5, writers  # 20 requests, at most 4 per worker process
    # and routes are patterns: no task id, no tenant slug in any label
    routes = label_values(after, LATENCY, "route")
    assert TASK_ROUTE in routes
    assert not any(str(world.task.pk) in route for route in routes)
    assert not any(world.tenant.slug in route for route in routes)
    # an unmatched path counts under one label, whatever the path
    httpx.get(f"{monitored.base_url}/no/such/{uuid.uuid4()}", timeout=10)
    assert "<unmatched>" in label_values(scrape(monitored), LATENCY, "route")


# --- /metrics: the database's gauges ----------------------------------------------------


def _task(tenant: Tenant, state: str, reason: str | None = None) -> Task:
    return Task.objects.create(
        tenant=tenant,
        state=state,
        reason_code=reason,
        client_task_id=f"metrics-{uuid.uuid4().hex[:8]}",
        registration_hash="0" * 64,
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id="issue-1",
        object_version="1",
    )


def test_the_database_gauges_move(
    monitored: Server, world: World, settings: Any
) -> None:
    settings.PORTAL_RELAY_NUDGE = False
    before = scrape(monitored)
    # when: two tasks wait for a person, an hour ago; one is claimed
    waiting = [
        _task(world.tenant, TaskState.HUMAN_REQUIRED, ReasonCode.FIELD_MISSING)
        for _ in range(2)
    ]
    _task(world.tenant, TaskState.HUMAN_CLAIMED, ReasonCode.FIELD_MISSING)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_task SET updated_at = now() - interval '1 hour' "
            "WHERE id = ANY(%s)",
            [[task.pk for task in waiting]],
        )
    # and three outbox rows wait, ten minutes old, one of them dead
    with transaction.atomic():
        for n in range(3):
            audit_services.event_append(
                tenant_id=world.tenant.pk,
                code=EventCode.TASK_TRANSITIONED,
                actor=Actor.system("metrics-tests"),
                data={"n": n},
            )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE audit_outbox SET created_at = now() - interval '10 minutes' "
            "WHERE tenant_id = %s",
            [world.tenant.pk],
        )
        cursor.execute(
            "UPDATE audit_outbox SET state = 'dead' WHERE id = "
            "(SELECT id FROM audit_outbox WHERE tenant_id = %s LIMIT 1)",
            [world.tenant.pk],
        )
    after = scrape(monitored)

    def rise(name: str, **labels: str) -> float:
        return sample_sum(after, name, **labels) - sample_sum(before, name, **labels)

    # then
    waiting_labels = {"state": "human_required", "reason": "FIELD_MISSING"}
    assert rise("portal_tasks", **waiting_labels) == 2
    assert rise("portal_tasks", state="human_claimed") == 1
    assert rise("portal_tasks", state="pending", reason="") == 0  # world's task: before
    assert sample_sum(after, "portal_tasks", state="pending") >= 1
    assert rise("portal_takeover_queue_size", state="human_required") == 2
    assert rise("portal_takeover_queue_size", state="human_claimed") == 1
    age = "portal_takeover_queue_oldest_age_seconds"
    assert sample_sum(after, age, state="human_required") >= 3600
    assert rise("portal_outbox_pending") == 2
    assert rise("portal_outbox_dead") == 1
    assert sample_sum(after, "portal_outbox_due") >= 2
    assert sample_sum(after, "portal_outbox_oldest_pending_age_seconds") >= 600
    assert sample_sum(after, "portal_metrics_database_up") == 1


# --- The gateway's verdicts, from the web workers ---------------------------------------


@pytest.fixture
def gateway_world(
    monitored: Server,
    transactional_db: None,
    desk: TicketDesk,
    tenant: Tenant,
    make_agent: Any,
) -> Iterator[GatewayWorld]:
    yield from make_world(
        tenant=tenant, make_agent=make_agent, desk=desk, base_url=monitored.base_url
    )


def test_gateway_verdicts_are_counted_by_check_and_reason(
    monitored: Server, gateway_world: GatewayWorld
) -> None:
    name = "portal_gateway_verdicts_total"
    refused = {"check": "fields", "verdict": "refused", "reason": "FIELD_MISSING"}
    passed = {"check": "contract", "verdict": "passed", "reason": ""}
    before = scrape(monitored)
    # when: the agent executes without a required field
    started = gateway_world.start_task()
    answer = gateway_world.execute(started, gateway_world.fields(email=None))
    assert answer.json()["code"] == "FIELD_MISSING", answer.text
    # then the contract check passed, the fields check refused, nothing after ran
    after = scrape(monitored)
    assert sample_sum(after, name, **refused) == sample_sum(before, name, **refused) + 1
    assert sample_sum(after, name, **passed) == sample_sum(before, name, **passed) + 1
    target = {"check": "target"}
    assert sample_sum(after, name, **target) == sample_sum(before, name, **target)


# --- Celery: job outcomes and lease expiries, from a real worker's pool ------------------


def test_a_workers_jobs_and_lease_expiries_are_counted(
    monitored: Server, celery_worker: Worker, world: World, amqp_url: str
) -> None:
    before = scrape(monitored)
    reap = "tasks.jobs.reap_leases_job"
    purge = "portal.jobs.purge_idempotent_requests_job"
    # given: a running task whose lease lapsed
    lapsed = _task(world.tenant, TaskState.RUNNING)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_task SET lease_owner = 'gone-worker', lease_token = 1, "
            "lease_acquired_at = app_now() - interval '2 min', "
            "lease_expires_at = app_now() - interval '1 min' WHERE id = %s",
            [lapsed.pk],
        )
    outcome = "portal_celery_job_outcomes_total"
    expiries = "portal_lease_expiries_total"
    done = sample_sum(before, outcome, job=reap, outcome="success")
    failed = sample_sum(before, outcome, job=purge, outcome="failure")
    expired = sample_sum(before, expiries, state="running")
    # when: the worker reaps, and runs a job that fails (an argument it does not take)
    celery_worker.send(amqp_url, reap)
    celery_worker.send(amqp_url, purge, unexpected="argument")
    # then
    after = wait_for(monitored, outcome, done + 1, job=reap, outcome="success")
    after = wait_for(monitored, outcome, failed + 1, job=purge, outcome="failure")
    assert sample_sum(after, expiries, state="running") == expired + 1
    lapsed.refresh_from_db()
    assert (lapsed.state, lapsed.reason_code) == ("pending", "LEASE_EXPIRED")


def test_a_retried_and_a_revoked_job_are_counted(
    monitored: Server, celery_worker: Worker, world: World, amqp_url: str
) -> None:
    """The two outcomes no plain job reaches: ``retry`` (a job that retries itself
    on a database error, ``run_operation_job``'s ``autoretry_for``) and ``revoked``
    (a job revoked before a worker took it; counted by the worker's main process)."""
    from config.celery import app

    run = "tasks.jobs.run_operation_job"
    outcome = "portal_celery_job_outcomes_total"
    before = scrape(monitored)
    retried = sample_sum(before, outcome, job=run, outcome="retry")
    revoked = sample_sum(before, outcome, job=run, outcome="revoked")
    failed = sample_sum(before, outcome, job=run, outcome="failure")
    job = {"tenant_id": str(world.tenant.pk), "operation_id": str(uuid.uuid4())}
    # given: the operations table locked by its owner, so the job's read of it
    # waits out the lock timeout (an OperationalError, which the job retries on)
    with connect_as("owner") as owner:
        owner.execute("LOCK TABLE tasks_operation IN ACCESS EXCLUSIVE MODE")
        # when
        celery_worker.send(amqp_url, run, **job)
        # then: one retry counted while the lock is held
        wait_for(monitored, outcome, retried + 1, job=run, outcome="retry")
        owner.rollback()
    # and the retry, with the table free, fails for good (no such operation)
    after = wait_for(monitored, outcome, failed + 1, job=run, outcome="failure")
    assert sample_sum(after, outcome, job=run, outcome="success") == sample_sum(
        before, outcome, job=run, outcome="success"
    )

    # when: a job is revoked before it is sent, then sent under that id. The
    # broadcast goes through an app of the worker's broker: the control mailbox
    # publishes through its app's own producer pool, whatever connection it is given.
    task_id = str(uuid.uuid4())
    # Not the current app: the shared jobs of later tests in this process must
    # still resolve to the portal's app (its task class, its queue type).
    control = Celery("revoker", broker=amqp_url, set_as_current=False)
    try:
        control.control.revoke(task_id)
    finally:
        control.close()
    # The broadcast reaches the worker before the job does: it logs the id it
    # flagged ("Tasks flagged as revoked: <id>", INFO).
    deadline = time.monotonic() + 30
    while not any(task_id in line for line in celery_worker.lines):
        assert time.monotonic() < deadline, celery_worker.lines[-20:]
        time.sleep(0.1)
    with app.connection_for_write(amqp_url) as broker_link:
        app.send_task(
            run, kwargs=job, queue=celery_worker.queue, task_id=task_id,
            connection=broker_link,
        )  # fmt: skip
    # then: discarded and counted, never run
    after = wait_for(monitored, outcome, revoked + 1, job=run, outcome="revoked")
    assert sample_sum(after, outcome, job=run, outcome="failure") == failed + 1
    assert any(task_id in line and "revoked" in line.lower()
               for line in celery_worker.lines), celery_worker.lines[-20:]  # fmt: skip


# --- Every metric the issue names is there -----------------------------------------------


def test_every_gauge_and_the_histogram_are_exposed(monitored: Server) -> None:
    """Declared even with nothing to count (the counters: in the tests above, where
    each moves; a counter appears at its first event)."""
    text = scrape(monitored)
    families = {
        family.name: family.type for family in text_string_to_metric_families(text)
    }
    assert families["portal_http_request_duration_seconds"] == "histogram"
    for name in (
        "portal_tasks",
        "portal_takeover_queue_size",
        "portal_takeover_queue_oldest_age_seconds",
        "portal_outbox_pending",
        "portal_outbox_due",
        "portal_outbox_dead",
        "portal_outbox_oldest_pending_age_seconds",
        "portal_metrics_database_up",
    ):
        assert families.get(name) == "gauge", name


# --- Health ----------------------------------------------------------------------------------


def test_healthz_and_readyz_answer_when_all_is_well(monitored: Server) -> None:
    alive = httpx.get(f"{monitored.base_url}/healthz", timeout=10)
    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})
    ready = httpx.get(f"{monitored.base_url}/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    assert ready.json() == {
        "status": "ok",
        "checks": {"database": "ok", "broker": "ok", "migrations": "ok"},
    }


def _not_ready(server: Server) -> dict[str, Any]:
    answer = httpx.get(f"{server.base_url}/readyz", timeout=30)
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert (problem["status"], problem["code"]) == (503, "NOT_READY")
    return problem


@pytest.fixture
def unmigrated_database(django_db_setup: None) -> Iterator[str]:
    """An empty database of this test run: reachable, no migration applied."""
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    with connect_as("admin", autocommit=True) as admin, admin.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url().rsplit("/", 1)[0] + f"/{name}"
    finally:
        with connect_as("admin", autocommit=True) as admin, admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_readyz_names_a_closed_broker_and_missing_migrations(
    unmigrated_database: str, tmp_path: Path
) -> None:
    with closed_port() as port:
        server = start(
            debug=False,
            log_path=tmp_path / "server.log",
            workers=1,
            env_extra={
                "DATABASE_URL": unmigrated_database,
                "CELERY_BROKER_URL": f"amqp://guest:guest@127.0.0.1:{port}//",
            },
            wait_path="/healthz",
        )
        try:
            problem = _not_ready(server)
            alive = httpx.get(f"{server.base_url}/healthz", timeout=10)
        finally:
            stop(server)
    assert problem["checks"] == {
        "database": "ok",
        "broker": "failed",
        "migrations": "failed",
    }
    assert problem["detail"] == "Not ready: broker, migrations."
    assert str(port) not in str(problem)  # no URL, host or exception text
    assert alive.status_code == 200


def test_healthz_and_metrics_need_no_database(amqp_url: str, tmp_path: Path) -> None:
    with closed_port() as port:
        server = start(
            debug=False,
            log_path=tmp_path / "server.log",
            workers=1,
            env_extra={
                "DATABASE_URL": f"postgres://portal_app@127.0.0.1:{port}/portal",
                "CELERY_BROKER_URL": amqp_url,
                "PORTAL_METRICS_TOKEN": TOKEN,
            },
            wait_path="/healthz",
        )
        try:
            alive = httpx.get(f"{server.base_url}/healthz", timeout=10)
            problem = _not_ready(server)
            # /metrics still answers: the database's gauges are missing, and say so
            text = scrape(server)
        finally:
            stop(server)
    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})
    assert problem["checks"] == {
        "database": "failed",
        "broker": "ok",
        "migrations": "failed",
    }
    assert "Traceback" not in problem["detail"]
    assert sample_sum(text, "portal_metrics_database_up") == 0
    assert "portal_tasks" not in sample_names(text)
    assert "portal_http_request_duration_seconds_count" in sample_names(text)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_the_operations_endpoints_answer_any_method_without_a_5xx(
    monitored: Server, path: str
) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS", "FOO"):
        answer = httpx.request(method, f"{monitored.base_url}{path}", timeout=30)
        assert answer.status_code == 405, (method, path, answer.status_code)
    for method in ("GET", "HEAD"):
        answer = httpx.request(method, f"{monitored.base_url}{path}", timeout=30)
        assert answer.status_code < 500, (method, path, answer.status_code)
