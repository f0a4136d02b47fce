"""The broker's durability, end to end (docs/outbox.md, "Quorum queues"): a RabbitMQ
node restarted while the relay drains an outbox loses no message.

The node is this test's own (tests/support/broker.py, ``PrivateNode``): stopping it
disturbs nobody else. Each test prints its figures and writes reports/<test>.json.
"""

from __future__ import annotations

import functools
import os
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
from audit.inbox import inbox_process_once
from audit.jobs import relay_outbox_job
from audit.models import EventCode, Outbox, OutboxState
from portal.actors import Actor
from portal.ids import new_id
from portal.models import Tenant
from portal.tracing import Trace
from tests.support.broker import EventQueue, PrivateNode
from tests.support.concurrency import run_in_threads

from .conftest import append_events, write_report

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _pending() -> int:
    return Outbox.objects.filter(state=OutboxState.PENDING).count()


@pytest.mark.timeout(600)  # a node's stop and start take ~20 s each on a busy machine
def test_a_broker_restart_under_load_loses_no_message(
    tenant: Tenant, private_node: PrivateNode, settings: Any
) -> None:
    """PORTAL_BROKER_RESTART_ROWS (600) outbox rows of 20 tasks, and a writer adding
    ~20 more a second, are relayed while the whole node is stopped and started again
    (``rabbitmqctl stop``, then ``rabbitmq-server``; the quorum queue's data folder
    kept). Afterwards a consumer takes every message from the quorum queue: every
    row's event id is there (duplicates allowed and counted: at least once), none
    unexpected, each task's first arrivals in the order its rows were written."""
    rows_n = int(os.environ.get("PORTAL_BROKER_RESTART_ROWS", "600"))
    exchange = f"portal.events.restart-{uuid.uuid4().hex[:8]}"
    settings.PORTAL_EVENTS_BROKER_URL = private_node.url
    settings.PORTAL_EVENTS_EXCHANGE = exchange
    settings.PORTAL_RELAY_NUDGE = False  # the relay thread below is the only relay
    # Small batches so the drain spans the restart; short backoff so the rows that
    # failed during it come back quickly after it.
    settings.PORTAL_OUTBOX_BATCH_SIZE = 10
    settings.PORTAL_OUTBOX_BACKOFF_CAP_S = 2.0
    queue = EventQueue(url=private_node.url, exchange=exchange).declare()
    assert private_node.queue_types()[queue.name] == "quorum"
    tasks = [new_id() for _ in range(20)]
    for start in range(0, rows_n, 500):
        append_events(
            tenant=tenant,
            task_ids=[tasks[n % len(tasks)] for n in range(start, min(rows_n, start + 500))],
        )  # fmt: skip
    stop_writing = threading.Event()
    stop_relaying = threading.Event()
    written = [0]
    totals: list[relay.RelayReport] = []

    def writer() -> None:
        """About 20 events/s, each in its own transaction."""
        n = 0
        while not stop_writing.is_set():
            with transaction.atomic(durable=True):
                audit_services.event_append(
                    tenant_id=tenant.pk,
                    code=EventCode.TASK_TRANSITIONED,
                    actor=Actor.system("restart-writer"),
                    task_id=tasks[n % len(tasks)],
                    data={"n": n},
                    trace=Trace.new(),
                )
            written[0] += 1
            n += 1
            time.sleep(0.05)

    def relay_worker() -> None:
        """Job runs back to back, as a busy worker would run them (a short pause when
        the broker is down, as beat's 5 s would be)."""
        while not stop_relaying.is_set():
            with broker_publisher() as publisher:
                report = relay.outbox_relay_drain(publisher=publisher)
            totals.append(report)
            stop_relaying.wait(0.5 if report.broker_down else 0.02)

    def restart() -> dict[str, float]:
        try:
            time.sleep(1.5)
            pending_at_stop = _pending()
            written_at_stop = written[0]
            stopped = time.monotonic()
            private_node.restart()
            restarted = time.monotonic()
            written_while_down = written[0] - written_at_stop
            time.sleep(1)
            stop_writing.set()
            deadline = time.monotonic() + 120
            while _pending() and time.monotonic() < deadline:
                time.sleep(0.2)
            drained = time.monotonic()
        finally:  # a failed restart ends the run instead of hanging it
            stop_writing.set()
            stop_relaying.set()
        return {
            "pending_at_stop": pending_at_stop,
            "written_while_down": written_while_down,
            "restart_s": restarted - stopped,
            "drain_s_after_restart": drained - restarted,
        }

    try:
        outcomes = run_in_threads(writer, relay_worker, restart, timeout=300)
    finally:
        stop_writing.set()
        stop_relaying.set()
    for outcome in outcomes:
        assert not isinstance(outcome, BaseException), outcome
    timing = outcomes[2]

    rows = list(
        Outbox.objects.filter(tenant=tenant)
        .order_by("id")
        .values_list("key", "state", "task_id")
    )
    keys = {key for key, _, _ in rows}
    received = queue.drain(expected=len(rows), timeout=120)
    queue_type_after = private_node.queue_types().get(queue.name)
    seen = Counter(r.message_id for r in received)
    lost = keys - set(seen)
    unexpected = set(seen) - keys
    first_arrivals: dict[str, list[str]] = {}
    for message in received:
        ids = first_arrivals.setdefault(str(message.body.get("task_id")), [])
        if message.message_id not in ids:
            ids.append(message.message_id)
    written_order: dict[str, list[str]] = {}
    for key, _, task_id in rows:
        written_order.setdefault(str(task_id), []).append(str(key))
    total = sum(totals, relay.RelayReport())
    write_report(
        "worker-broker-restart",
        {
            "rows": len(rows),
            "seeded": rows_n,
            "written_during": written[0],
            "pending_at_stop": timing["pending_at_stop"],
            "written_while_down": timing["written_while_down"],
            "restart_s": round(timing["restart_s"], 1),
            "drain_s_after_restart": round(timing["drain_s_after_restart"], 1),
            "relay_failed_rows": total.failed,
            "received": len(received),
            "duplicates": sum(n - 1 for n in seen.values()),
            "lost": len(lost),
            "unexpected": len(unexpected),
            "queue_type_after": queue_type_after,
        },
    )
    # The restart happened under load: events were written while the node was down
    # (the seed may already be drained when it stops; the relay is fast), and the
    # relay met the outage: it tried rows and they failed, to be sent afterwards.
    assert timing["written_while_down"] > 0
    assert total.broker_down
    assert total.failed > 0
    assert {state for _, state, _ in rows} == {"sent"}
    assert not lost, sorted(lost)[:5]
    assert not unexpected
    assert queue_type_after == "quorum"
    assert first_arrivals == written_order


def _enqueued(node: PrivateNode, queue: str) -> int:
    """Messages the node holds in the queue, as the broker counts them."""
    out = node.ctl("list_queues", "name", "messages", "--quiet", "--no-table-headers")
    counts = dict(line.split("\t")[:2] for line in out.splitlines() if "\t" in line)
    return int(counts.get(queue, 0))


@pytest.mark.timeout(600)  # the node's start alone took over 300 s at load 39
def test_a_memory_alarm_stalls_the_relay_boundedly_and_loses_nothing(
    tenant: Tenant, private_node: PrivateNode, settings: Any, caplog: Any
) -> None:
    """R11: a RabbitMQ memory alarm blocks publishers. Rows written before and
    *during* the alarm (a writer, one event per transaction) are relayed by the
    relay's job (``relay_outbox_job``, called as a worker calls it): each run ends
    as soon as the broker says ``connection.blocked``, well within the confirm
    timeout, sends nothing, says so in a log line and in each tried row's
    ``last_error``, and no row is ``sent`` (raw SQL) while no confirm can come. Once the alarm is cleared the rows drain; a
    consumer takes every message through the inbox (``audit.inbox``), which drops
    the repeats (a message the broker took in before it blocked, never confirmed,
    is published again), and processes every event id exactly once, each task's in
    the order its rows were written: 0 lost, 0 reordered."""
    exchange = f"portal.events.alarm-{uuid.uuid4().hex[:8]}"
    settings.PORTAL_EVENTS_BROKER_URL = private_node.url
    settings.PORTAL_EVENTS_EXCHANGE = exchange
    settings.PORTAL_RELAY_NUDGE = False  # the job runs below are the only relay
    # The default's order: a run that waited for confirms would take this long.
    settings.PORTAL_OUTBOX_CONFIRM_TIMEOUT_S = 8.0
    settings.PORTAL_OUTBOX_BACKOFF_CAP_S = 2.0
    queue = EventQueue(url=private_node.url, exchange=exchange).declare()
    tasks = [new_id() for _ in range(6)]
    append_events(tenant=tenant, task_ids=[tasks[n % len(tasks)] for n in range(60)])
    private_node.ctl("set_vm_memory_high_watermark", "absolute", "1")
    deadline = time.monotonic() + 30
    while "memory" not in private_node.ctl("eval", "rabbit_alarm:get_alarms()."):
        assert time.monotonic() < deadline, "the memory alarm did not go off"
        time.sleep(0.2)

    writing_done = threading.Event()
    written_during = [0]

    def writer() -> None:
        """40 events while the alarm holds, ~10 a second, each committed alone."""
        try:
            for n in range(40):
                with transaction.atomic(durable=True):
                    audit_services.event_append(
                        tenant_id=tenant.pk,
                        code=EventCode.TASK_TRANSITIONED,
                        actor=Actor.system("alarm-writer"),
                        task_id=tasks[n % len(tasks)],
                        data={"n": 60 + n},
                        trace=Trace.new(),
                    )
                written_during[0] += 1
                time.sleep(0.1)
        finally:
            writing_done.set()

    def relay_runs() -> list[tuple[float, dict[str, Any]]]:
        """The relay's job back to back until the writer is done and a run tried
        rows written during the alarm: (seconds, report) per run."""
        runs: list[tuple[float, dict[str, Any]]] = []
        while True:
            done = writing_done.is_set()
            began = time.monotonic()
            report = relay_outbox_job()
            runs.append((time.monotonic() - began, report))
            if done and report["claimed"]:
                return runs
            assert len(runs) < 60, runs
            time.sleep(0.2)

    outcomes = run_in_threads(writer, relay_runs, timeout=180)
    for outcome in outcomes:
        assert not isinstance(outcome, BaseException), outcome
    runs: list[tuple[float, dict[str, Any]]] = outcomes[1]
    with connection.cursor() as cursor:  # raw SQL: what the table says
        cursor.execute(
            "SELECT state, count(*), count(*) FILTER (WHERE attempts > 0),"
            " bool_and(last_error LIKE '%%blocked publishers%%')"
            "   FILTER (WHERE COALESCE(last_error, '') <> '')"
            " FROM audit_outbox WHERE tenant_id = %s GROUP BY state",
            [tenant.pk],
        )
        during = {row[0]: row[1:] for row in cursor.fetchall()}
    enqueued_during = _enqueued(private_node, queue.name)

    private_node.ctl("set_vm_memory_high_watermark", "0.4")
    cleared = time.monotonic()
    deadline = cleared + 60
    while _pending() and time.monotonic() < deadline:
        relay_outbox_job()
        time.sleep(0.2)
    drain_s = time.monotonic() - cleared
    rows = list(
        Outbox.objects.filter(tenant=tenant).order_by("id").values_list("key", "state", "task_id")
    )  # fmt: skip
    received = queue.drain(expected=len(rows), timeout=60)
    processed: list[str] = []
    repeats = 0
    for message in received:
        if not inbox_process_once(
            consumer="alarm-test",
            message_id=message.message_id,
            handler=functools.partial(processed.append, message.message_id),
        ):
            repeats += 1
    task_of = {str(key): str(task_id) for key, _, task_id in rows}
    processed_order: dict[str, list[str]] = {}
    for key in processed:
        processed_order.setdefault(task_of.get(key, "?"), []).append(key)
    written_order: dict[str, list[str]] = {}
    for key, _, task_id in rows:
        written_order.setdefault(str(task_id), []).append(str(key))
    longest = max(seconds for seconds, _ in runs)
    write_report(
        "worker-broker-memory-alarm",
        {
            "rows": len(rows),
            "written_during_alarm": written_during[0],
            "confirm_timeout_s": settings.PORTAL_OUTBOX_CONFIRM_TIMEOUT_S,
            "job_runs_during_alarm": len(runs),
            "job_run_s_max": round(longest, 2),
            "rows_claimed_during_alarm": sum(r["claimed"] for _, r in runs),
            "sent_during_alarm": sum(r["sent"] for _, r in runs),
            "enqueued_unconfirmed_during_alarm": enqueued_during,
            "drain_s_after_clear": round(drain_s, 1),
            "received": len(received),
            "repeats_dropped_by_inbox": repeats,
            "processed": len(processed),
            "lost": len({str(key) for key, _, _ in rows} - set(processed)),
        },
    )
    # Bounded, and not by the confirm timeout: the broker's connection.blocked ends
    # the wait (half the timeout leaves room for a loaded machine's claim and record).
    assert longest < settings.PORTAL_OUTBOX_CONFIRM_TIMEOUT_S / 2, runs
    assert written_during[0] == 40
    assert all(r["broker_down"] and r["sent"] == 0 for _, r in runs if r["claimed"])
    assert sum(r["claimed"] for _, r in runs) >= 60 + 1  # the seed and newer rows
    # No row marked sent without a confirm; every row tried says why it waits.
    assert set(during) == {"pending"}, during
    total, tried, confirm_errors = during["pending"]
    assert total == 100 and tried > 0 and confirm_errors is True
    assert any("broker link failed" in r.getMessage() for r in caplog.records)
    # After the alarm: every row sent, every event processed once, in task order.
    assert {state for _, state, _ in rows} == {"sent"}
    assert sorted(processed) == sorted(str(key) for key, _, _ in rows)
    assert repeats == len(received) - len(rows)
    assert processed_order == written_order
