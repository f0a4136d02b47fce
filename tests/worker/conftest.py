"""Fixtures of the worker tier: real RabbitMQ, real processes, real PostgreSQL.

Each test gets its own topic exchange on the machine's broker (shared with anything
else running here) and its settings point the relay at it. Subprocesses (relays, the
example consumer, Celery workers) get the test database through ``DATABASE_URL``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection, transaction

from audit import relay
from audit import services as audit_services
from audit.broker import broker_publisher
from audit.models import EventCode
from portal import db_roles
from portal.actors import Actor
from portal.models import Tenant
from portal.tracing import Trace
from tests.support import broker
from tests.support.broker import EventQueue, PrivateNode
from tests.support.db import connect_as

REPO = Path(__file__).resolve().parents[2]

# The shared broker fixtures (tests/support/broker.py), for this tier's tests.
amqp_url = broker.amqp_url
events_exchange = broker.events_exchange
celery_test_queue = broker.celery_test_queue
REPORTS = REPO / "reports"


@pytest.fixture
def private_node() -> Iterator[PrivateNode]:
    """A RabbitMQ node of this test alone, so stopping or restarting it disturbs
    nobody else. Under CI a node that cannot start fails the test."""
    reason = PrivateNode.unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    node = PrivateNode()
    try:
        node.start()
        yield node
    finally:
        node.stop()


@pytest.fixture
def event_queue(amqp_url: str, events_exchange: str) -> Iterator[EventQueue]:
    """A durable queue bound to the test's exchange with ``#``, declared first."""
    queue = EventQueue(url=amqp_url, exchange=events_exchange).declare()
    yield queue
    queue.delete()


@dataclass(frozen=True, kw_only=True)
class Appended:
    event_id: uuid.UUID
    task_id: uuid.UUID | None
    trace_id: str


def append_events(
    *, tenant: Tenant, task_ids: Sequence[uuid.UUID | None], nudge: bool = False
) -> list[Appended]:
    """One event (and outbox row) per entry, in one transaction, in this order."""
    appended = []
    with transaction.atomic():
        for index, task_id in enumerate(task_ids):
            trace = Trace.new()
            event_id = audit_services.event_append(
                tenant_id=tenant.pk,
                code=EventCode.TASK_TRANSITIONED,
                actor=Actor.system("worker-tests"),
                task_id=task_id,
                data={"n": index},
                trace=trace,
            )
            appended.append(
                Appended(event_id=event_id, task_id=task_id, trace_id=trace.trace_id)
            )
        if nudge:
            relay.nudge_relay()
    return appended


def timed_drain() -> tuple[relay.RelayReport, float]:
    """One relay drain through a fresh publisher, and how long it took (s)."""
    began = time.monotonic()
    with broker_publisher() as publisher:
        report = relay.outbox_relay_drain(publisher=publisher)
    return report, time.monotonic() - began


@pytest.fixture
def outbox_states() -> Callable[[], dict[str, int]]:
    def states() -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT state, count(*) FROM audit_outbox GROUP BY state")
            return dict(cursor.fetchall())

    return states


def lag_ms() -> list[float]:
    """Commit-to-publish lag of every sent row: ``sent_at - created_at``, in ms.

    ``created_at`` is the writing transaction's start, a hair before its commit.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM sent_at - created_at) * 1000 FROM audit_outbox"
            " WHERE state = 'sent' ORDER BY 1"
        )
        return [float(row[0]) for row in cursor.fetchall()]


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (``q`` in 0..100)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def write_report(name: str, figures: dict[str, Any]) -> None:
    """Print the figures and keep them in reports/<name>.json (git-ignored)."""
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / f"{name}.json").write_text(json.dumps(figures, indent=2, default=str))
    print(f"\n{name}: " + json.dumps(figures, default=str))


def database_url() -> str:
    """The test database, for subprocesses."""
    params = connection.settings_dict
    user = quote(params.get("USER") or "")
    password = params.get("PASSWORD") or ""
    auth = f"{user}:{quote(password)}@" if password else f"{user}@"
    host = params.get("HOST") or "127.0.0.1"
    port = params.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{params['NAME']}"


def subprocess_env(*, amqp_url: str, exchange: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        PORTAL_EVENTS_BROKER_URL=amqp_url,
        PORTAL_EVENTS_EXCHANGE=exchange,
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    env.update(extra)
    return env


PYTHON = sys.executable


@pytest.fixture
def inbox_consumer() -> Iterator[str]:
    """A consumer name of this test only; its inbox and example rows are removed."""
    name = f"test-consumer-{uuid.uuid4().hex[:10]}"
    # The example's own table, made by the owner: the app role may not create one.
    spec = importlib.util.spec_from_file_location(
        "outbox_consumer", REPO / "examples" / "outbox_consumer.py"
    )
    assert spec is not None and spec.loader is not None
    example = sys.modules.setdefault(
        "outbox_consumer", importlib.util.module_from_spec(spec)
    )
    if not hasattr(example, "_SCHEMA"):
        spec.loader.exec_module(example)
    with connect_as("owner", autocommit=True) as owner, owner.cursor() as cursor:
        cursor.execute(example._SCHEMA)
        db_roles.grant_app_role(cursor, test_clock=True)
    yield name
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM audit_inbox WHERE consumer = %s", [name])
        cursor.execute("SELECT to_regclass('example_topic_count') IS NOT NULL")
        if cursor.fetchone()[0]:
            cursor.execute(
                "DELETE FROM example_topic_count WHERE consumer = %s", [name]
            )


@pytest.fixture(autouse=True)
def _each_test_on_its_celery_queue(celery_test_queue: str) -> str:
    """Every worker-tier test sends its jobs and nudges to a queue of its own."""
    return celery_test_queue


@pytest.fixture(autouse=True)
def _fresh_nudge_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no recent nudge and no pause: the coalescing window
    (relay.NUDGE_MIN_INTERVAL_S) must not carry one test's nudge into the next."""
    from audit import relay

    monkeypatch.setattr(relay, "_last_nudge_at", float("-inf"))
    monkeypatch.setattr(relay, "_nudge_paused_until", 0.0)
