"""The API (real gunicorn), a real Celery worker and the outbox relay it runs, all
connected through PgBouncer in transaction pooling mode."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from portal import db_roles
from portal import services as portal_services
from portal.models import Tenant
from tasks import services as task_services
from tasks.models import Operation
from tests.fault.harness import WorkerPool
from tests.gateway.conftest import World
from tests.http.conftest import start, stop
from tests.support.broker import EventQueue, delete_exchange, delete_queue
from tests.support.connectors import desk_connector
from tests.support.contracts import SPEC, TARGET
from tests.support.outbound import allow as outbound_allow
from tests.support.pgbouncer import PgBouncer
from ticketdesk.harness import TicketDesk, start_ticketdesk

from .conftest import bouncer_settings

pytestmark = pytest.mark.django_db(transaction=True)

ISSUES = 3
SETTLE_TIMEOUT_S = 90.0


@pytest.fixture
def desk(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[TicketDesk]:
    with start_ticketdesk() as running:
        # Named in the allow-list here and for the processes started after it.
        outbound_allow(settings, monkeypatch, running.url)
        yield running


@pytest.fixture
def services(
    bouncer: PgBouncer,
    amqp_url: str,
    tmp_path: Path,
    transactional_db: None,
    desk: TicketDesk,  # first: gunicorn and the worker inherit its allow-list entry
) -> Iterator[dict[str, Any]]:
    """Gunicorn and one Celery worker (prefork, 2 children), both on PgBouncer, a
    queue and an events exchange of this test only."""
    from django.db import connection

    queue = f"pgbouncer-test-{uuid.uuid4().hex[:10]}"
    exchange = f"portal.events.pgbouncer-{uuid.uuid4().hex[:10]}"
    events = EventQueue(url=amqp_url, exchange=exchange).declare()
    env = {
        "DATABASE_URL": bouncer.url(
            user=db_roles.APP_ROLE, dbname=connection.settings_dict["NAME"]
        ),
        "CELERY_BROKER_URL": amqp_url,
        "PORTAL_CELERY_QUEUE": queue,
        "PORTAL_EVENTS_EXCHANGE": exchange,
        **bouncer_settings(),
    }
    server = start(debug=False, log_path=tmp_path / "gunicorn.log", env_extra=env)
    worker_env = {**os.environ, "PORTAL_DEV_MODE": "1", "PYTHONUNBUFFERED": "1", **env}
    worker_env.pop("DJANGO_SECRET_KEY", None)
    workers = WorkerPool(
        count=1, queue=queue, env=worker_env, log_dir=tmp_path, concurrency=2
    )
    try:
        workers.start_all()
        yield {"server": server, "events": events, "workers": workers}
    finally:
        workers.stop()
        stop(server)
        events.delete()
        delete_exchange(amqp_url, exchange)
        delete_queue(amqp_url, queue)
    assert "Traceback" not in server.log(), server.log()[-5000:]
    for slot in workers.slots:
        log = slot.log_path.read_text(errors="replace")
        assert "Traceback" not in log, log[-5000:]


def test_the_api_worker_and_relay_work_through_pgbouncer(
    services: dict[str, Any],
    bouncer: PgBouncer,
    desk: TicketDesk,
    tenant: Tenant,
    make_agent: Any,
) -> None:
    # Given: a published contract, a connector to a real ticket desk and an agent
    # with a key, talking to gunicorn; web and worker reach PostgreSQL through
    # PgBouncer only.
    contract = task_services.contract_create(
        tenant=tenant, key="customer-issue", spec=SPEC, publish=True
    )
    connector = desk_connector(
        tenant=tenant,
        desk=desk,
        target=TARGET,
        read_timeout_s=5.0,
        connect_timeout_s=2.0,
    )
    agent = make_agent(tenant=tenant, grants=())
    portal_services.agent_grant(agent=agent, action="create_ticket", target=TARGET)
    secret = portal_services.agent_key_issue(agent=agent).secret
    server = services["server"]
    with httpx.Client(
        base_url=server.base_url,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
        trust_env=False,
    ) as http:
        world = World(tenant, agent, http, desk, contract, connector)
        # When: the agent starts ISSUES tasks and queues each call for a worker.
        started = [world.start_task(n) for n in range(1, ISSUES + 1)]
        for one in started:
            queued = http.post(
                f"/api/v1/operations/{one['operation']['id']}/execute",
                json={"field_values": world.fields()},
                headers={
                    "Lease-Token": str(one["token"]),
                    "Prefer": "respond-async",
                },
            )
            assert queued.status_code == 202, queued.text
        ids = [one["operation"]["id"] for one in started]
        # Then: the worker made each call once and recorded it.
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            states = set(
                Operation.objects.filter(pk__in=ids).values_list("state", flat=True)
            )
            if states == {"verified"}:
                break
            time.sleep(0.5)
        assert states == {"verified"}, states
        assert world.tickets() == ISSUES
        # And: the API reads the outcome back through PgBouncer.
        for one in started:
            answer = http.get(f"/api/v1/operations/{one['operation']['id']}")
            assert answer.status_code == 200 and answer.json()["state"] == "verified"
    # And: the relay (nudged, run by the worker) published the tasks' events.
    task_ids = {one["task"]["id"] for one in started}
    received = services["events"].drain(expected=ISSUES, timeout=60)
    published = {m.body.get("task_id") for m in received}
    assert task_ids <= published, (task_ids, published)
    # And: the worker and web really went through the pool.
    pools = [
        pool
        for pool in bouncer.show("POOLS")
        if pool["user"] == db_roles.APP_ROLE
    ]
    assert pools, bouncer.show("POOLS")
    totals = bouncer.show("STATS")
    assert sum(int(row["total_xact_count"]) for row in totals) > 0
