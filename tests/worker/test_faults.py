"""Fault tests of the relay (docs/outbox.md, "Tests"): real processes, SIGKILL,
a RabbitMQ node stopped under load, and a real Celery worker.

Each prints its figures and writes reports/<test>.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from django.db import connection, transaction

from audit import relay
from audit import services as audit_services
from audit.broker import broker_publisher
from audit.models import EventCode, Outbox, OutboxState
from portal.actors import Actor
from portal.ids import new_id
from portal.models import Tenant
from portal.tracing import Trace
from tests.support.broker import EventQueue, PrivateNode
from tests.support.celery_worker import celery_worker_running
from tests.support.concurrency import run_in_threads

from .conftest import (
    PYTHON,
    REPO,
    append_events,
    lag_ms,
    percentile,
    subprocess_env,
    write_report,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _inbox_rows(consumer: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM audit_inbox WHERE consumer = %s", [consumer]
        )
        return int(cursor.fetchone()[0])


def _topic_count(consumer: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(sum(messages), 0) FROM example_topic_count"
            " WHERE consumer = %s",
            [consumer],
        )
        return int(cursor.fetchone()[0])


def test_relay_sigkilled_between_confirms_and_mark_republishes_and_inbox_dedupes(
    tenant: Tenant,
    event_queue: EventQueue,
    amqp_url: str,
    inbox_consumer: str,
    settings: Any,
) -> None:
    """A relay process is SIGKILLed right after the broker confirmed its 3rd wave,
    before marking it sent. Two tasks of ten rows make waves of two (wave k holds
    each task's k-th row): waves 1 and 2 are sent, wave 3's two confirmed rows stay
    leased, nobody republishes them until the lease lapses, then a second relay
    publishes them again. The consumer sees those two messages twice and, through
    the inbox, processes every message exactly once, each task in order."""
    lease_s = 3.0
    settings.PORTAL_OUTBOX_CLAIM_LEASE_S = lease_s
    task_a, task_b = new_id(), new_id()
    appended = append_events(tenant=tenant, task_ids=[task_a] * 10 + [task_b] * 10)
    keys = [str(a.event_id) for a in appended]
    env = subprocess_env(
        amqp_url=amqp_url,
        exchange=event_queue.exchange.name,
        PORTAL_FAULT_POINT="after_publish",
        PORTAL_FAULT_AFTER="3",
        PORTAL_TEST_CLAIM_LEASE_S=str(lease_s),
    )

    # when: the first relay dies once its 3rd wave is confirmed
    killed = subprocess.run(
        [PYTHON, "-m", "tests.worker.relay_process"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    killed_at = time.monotonic()
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert json.loads(killed.stdout.splitlines()[-1]) == {"killed_at": "after_publish"}

    # then: two waves sent (A1 A2 B1 B2), the third (A3 B3) published but still
    # pending (leased), like everything behind it
    states = dict(Outbox.objects.filter(tenant=tenant).values_list("key", "state"))
    sent_first = keys[0:2] + keys[10:12]
    assert sorted(k for k, state in states.items() if state == "sent") == sorted(
        sent_first
    )
    assert all(states[k] == "pending" for k in keys if k not in sent_first)
    # Within the lease no other relay touches them (the normal path: no duplicate).
    with broker_publisher() as publisher:
        assert relay.outbox_relay_once(publisher=publisher).claimed == 0
        time.sleep(max(0.0, lease_s + 0.5 - (time.monotonic() - killed_at)))
        report = relay.outbox_relay_drain(publisher=publisher)
    assert (report.sent, report.failed) == (16, 0)

    # The example consumer (a real process) reads the queue through the inbox.
    consumer = subprocess.run(
        [PYTHON, "examples/outbox_consumer.py", "--broker", amqp_url,
         "--queue", event_queue.name, "--exchange", event_queue.exchange.name,
         "--consumer", inbox_consumer, "--idle-exit", "2", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert consumer.returncode == 0, consumer.stderr
    lines = [json.loads(line) for line in consumer.stdout.splitlines()]
    deliveries = [line for line in lines if "message_id" in line]
    summary = lines[-1]["summary"]
    seen = Counter(d["message_id"] for d in deliveries)
    processed = Counter(d["message_id"] for d in deliveries if d["processed"])
    duplicates = sum(n - 1 for n in seen.values())
    lost = set(keys) - set(seen)
    # Task order holds even with the duplicates: A1..A3, A3 again, A4..A10; B alike.
    order_a = [d["message_id"] for d in deliveries if d["message_id"] in keys[:10]]
    order_b = [d["message_id"] for d in deliveries if d["message_id"] in keys[10:]]
    assert order_a == keys[:3] + keys[2:10]
    assert order_b == keys[10:13] + keys[12:20]
    # Each delivery, the duplicate too, was processed in its event's trace: the
    # relay's traceparent header, continued by the consumer's span.
    traces = {str(a.event_id): a.trace_id for a in appended}
    assert all(d["trace_id"] == traces[d["message_id"]] for d in deliveries)
    lags = lag_ms()
    write_report(
        "worker-relay-sigkill",
        {
            "messages": len(keys),
            "kills": 1,
            "deliveries": len(deliveries),
            "redelivered_flag": summary["redelivered"],
            "duplicates": duplicates,
            "duplicate_ids": [k for k, n in seen.items() if n > 1],
            "processed": summary["processed"],
            "lost": len(lost),
            "inbox_rows": _inbox_rows(inbox_consumer),
            "effects": _topic_count(inbox_consumer),
            "lease_s": lease_s,
            "lag_p50_ms": round(percentile(lags, 50), 1),
            "lag_p99_ms": round(percentile(lags, 99), 1),
        },
    )
    assert seen[keys[2]] == seen[keys[12]] == 2 and duplicates == 2
    assert not lost
    assert all(n == 1 for n in processed.values()) and len(processed) == 20
    assert summary == {
        "delivered": 22, "processed": 20, "duplicates": 2, "redelivered": 0,
        "rejected": 0,
    }  # fmt: skip
    assert _inbox_rows(inbox_consumer) == 20
    assert _topic_count(inbox_consumer) == 20  # the business effect, once per message


def test_broker_outage_keeps_writes_available_and_the_backlog_drains(
    tenant: Tenant, private_node: PrivateNode, settings: Any
) -> None:
    """RabbitMQ's app is stopped for PORTAL_BROKER_OUTAGE_S (20 s) while writers keep
    committing events with nudges: every write succeeds, rows wait, the relay backs
    off with one connection attempt per batch, and after start_app everything is
    delivered: lost = unexpected = none."""
    outage_s = float(os.environ.get("PORTAL_BROKER_OUTAGE_S", "20"))
    exchange = f"portal.events.outage-{uuid.uuid4().hex[:8]}"
    settings.PORTAL_EVENTS_BROKER_URL = private_node.url
    settings.PORTAL_EVENTS_EXCHANGE = exchange
    from tests.support.broker import redirect_celery

    redirect_celery(broker_url=private_node.url, queue=f"celery-{exchange}")
    queue = EventQueue(url=private_node.url, exchange=exchange).declare()
    tasks = [new_id() for _ in range(10)]
    stop_writing = threading.Event()
    stop_relaying = threading.Event()
    phase = {"now": "before"}
    writes: Counter[str] = Counter()
    write_errors: list[str] = []
    write_latency_ms: list[float] = []
    backlog_peak = [0]
    relay_totals: list[relay.RelayReport] = []
    connect_attempts = [0]

    def writer() -> None:
        """About 20 events/s, each in its own transaction, each with a nudge."""
        n = 0
        while not stop_writing.is_set():
            started = time.monotonic()
            try:
                with transaction.atomic(durable=True):
                    audit_services.event_append(
                        tenant_id=tenant.pk,
                        code=EventCode.TASK_TRANSITIONED,
                        actor=Actor.system("outage-writer"),
                        task_id=tasks[n % len(tasks)] if n % 5 else None,
                        data={"n": n},
                        trace=Trace.new(),
                    )
                    relay.nudge_relay()
                writes[phase["now"]] += 1
                write_latency_ms.append((time.monotonic() - started) * 1000)
            except Exception as error:  # noqa: BLE001
                write_errors.append(repr(error))
            n += 1
            time.sleep(0.05)

    def relay_worker() -> None:
        """A relay worker as beat + nudges would run it: a job run every 0.5 s."""
        while not stop_relaying.is_set():
            with broker_publisher() as publisher:
                relay_totals.append(relay.outbox_relay_drain(publisher=publisher))
            connect_attempts[0] += publisher.connect_attempts
            backlog = relay.outbox_backlog()
            backlog_peak[0] = max(backlog_peak[0], backlog.pending)
            stop_relaying.wait(0.5)

    def outage() -> dict[str, float]:
        time.sleep(2)
        phase["now"] = "during"
        private_node.stop_app()
        stopped = time.monotonic()
        try:
            time.sleep(outage_s)
        finally:
            phase["now"] = "after"
            private_node.start_app()
        restarted = time.monotonic()
        time.sleep(2)
        stop_writing.set()
        # Drain: wait until nothing is pending, at most a minute.
        deadline = time.monotonic() + 60
        while Outbox.objects.filter(state=OutboxState.PENDING).exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        drained = time.monotonic()
        stop_relaying.set()
        return {
            "outage_s": restarted - stopped,
            "drain_s_after_restart": drained - restarted,
        }

    try:
        outcomes = run_in_threads(writer, relay_worker, outage, timeout=outage_s + 120)
    finally:
        stop_writing.set()
        stop_relaying.set()
    for outcome in outcomes:
        assert not isinstance(outcome, BaseException), outcome
    timing = outcomes[2]

    rows = dict(Outbox.objects.filter(tenant=tenant).values_list("key", "state"))
    received = queue.drain(expected=len(rows), timeout=60)
    queue.delete()
    seen = Counter(r.message_id for r in received)
    lost = set(rows) - set(seen)
    unexpected = set(seen) - set(rows)
    total = sum(relay_totals, relay.RelayReport())
    lags = lag_ms()
    attempted = sum(writes.values()) + len(write_errors)
    latency = sorted(write_latency_ms)
    write_report(
        "worker-broker-outage",
        {
            "outage_s": round(timing["outage_s"], 1),
            "writes_before_during_after": [writes[p] for p in ("before", "during", "after")],
            "write_errors": len(write_errors),
            "write_availability_pct": round(100 * sum(writes.values()) / attempted, 3),
            "write_p99_ms": round(percentile(latency, 99), 1),
            "peak_backlog": backlog_peak[0],
            "drain_s_after_restart": round(timing["drain_s_after_restart"], 1),
            "relay_connect_attempts": connect_attempts[0],
            "relay_failed_rows": total.failed,
            "messages": len(rows),
            "received": len(received),
            "duplicates": sum(n - 1 for n in seen.values()),
            "lost": len(lost),
            "unexpected": len(unexpected),
            "dead": sum(state == "dead" for state in rows.values()),
            "lag_p50_ms": round(percentile(lags, 50), 1),
            "lag_p99_ms": round(percentile(lags, 99), 1),
        },
    )  # fmt: skip
    assert write_errors == []
    assert writes["during"] >= outage_s * 10  # writes went on at ~20/s
    assert set(rows.values()) == {"sent"}
    assert not lost and not unexpected
    assert total.broker_down  # the relay did notice the outage
    assert timing["drain_s_after_restart"] < 60


def test_a_celery_worker_relays_after_a_nudge(
    tenant: Tenant,
    event_queue: EventQueue,
    amqp_url: str,
    celery_test_queue: str,
) -> None:
    """A real Celery worker consuming the nudge runs ``relay_outbox_job``: rows
    committed with a nudge reach the exchange without anyone calling the relay."""
    env = subprocess_env(
        amqp_url=amqp_url,
        exchange=event_queue.exchange.name,
        CELERY_BROKER_URL=amqp_url,
    )
    with celery_worker_running(
        queue=celery_test_queue, env=env, name="relaytest", ready_s=60
    ) as worker:
        # when: two commits, each with a nudge
        started = time.monotonic()
        appended = append_events(tenant=tenant, task_ids=[None, None], nudge=True)
        appended += append_events(tenant=tenant, task_ids=[None], nudge=True)
        received = event_queue.drain(expected=3, timeout=60, idle=0.2)
        latency = time.monotonic() - started
    output = worker.output()
    assert sorted(r.message_id for r in received) == sorted(
        str(a.event_id) for a in appended
    ), output[-3000:]
    assert "relay_outbox_job" in output
    write_report(
        "worker-celery-nudge",
        {"messages": 3, "received": len(received),
         "commit_to_all_received_s": round(latency, 2)},
    )  # fmt: skip
