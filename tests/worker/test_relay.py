"""The outbox relay against real RabbitMQ and PostgreSQL (docs/style.md R9, R18).

Publishing with confirms, many relays at once, backoff and dead rows, a writer that
dies after its commit, the commit-hook nudge, and the consumer's inbox.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import random
import re
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction

from audit import relay
from audit import services as audit_services
from audit.broker import broker_publisher
from audit.inbox import inbox_process_once
from audit.models import EventCode, Outbox, OutboxState
from portal import scope
from portal.actors import Actor
from portal.db import db_now
from portal.exceptions import TransactionForbidden
from portal.ids import new_id
from portal.models import Tenant
from tests.support.broker import EventQueue, closed_port, queued_messages
from tests.support.concurrency import run_in_threads
from tests.support.db import db_clock_offset

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


def _relay_until_empty(*, limit: int = 50) -> relay.RelayReport:
    """A relay worker: passes until nothing is pending any more."""
    total = relay.RelayReport()
    with broker_publisher() as publisher:
        while True:
            report = relay.outbox_relay_once(publisher=publisher, limit=limit)
            total += report
            if report.claimed:
                continue
            if not Outbox.objects.filter(state=OutboxState.PENDING).exists():
                return total
            time.sleep(0.01)  # another relay holds the rest


def test_relay_publishes_with_confirms_and_marks_rows_sent(
    tenant: Tenant, event_queue: EventQueue
) -> None:
    """Each row goes out persistent, confirmed, with the event id as message_id, the
    topic as routing key and tenant + traceparent headers; then it is ``sent``."""
    # given: two events of one task and one without a task
    task_id = new_id()
    appended = append_events(tenant=tenant, task_ids=[task_id, task_id, None])

    # when
    with broker_publisher() as publisher:
        report = relay.outbox_relay_once(publisher=publisher)

    # then: the broker acked each message (it only does in publisher-confirm mode)
    assert publisher.acks == 3
    assert report == relay.RelayReport(claimed=3, sent=3)
    received = event_queue.drain(expected=3)
    # Two waves: the task's first row with the taskless one, then its second row.
    first, second, taskless = appended
    in_waves = [first, taskless, second]
    assert [r.message_id for r in received] == [str(a.event_id) for a in in_waves]
    for message, event in zip(received, in_waves, strict=True):
        assert message.routing_key == "task.transitioned"
        assert message.headers["tenant_id"] == str(tenant.pk)
        assert re.fullmatch(
            rf"00-{event.trace_id}-[0-9a-f]{{16}}-01", message.headers["traceparent"]
        )
        assert message.properties["delivery_mode"] == 2
        assert message.properties["content_type"] == "application/json"
        assert message.body["event_id"] == str(event.event_id)
        assert message.body["schema_version"] == 1
        assert message.body["tenant_id"] == str(tenant.pk)
    rows = list(Outbox.objects.filter(tenant=tenant))
    assert {row.state for row in rows} == {OutboxState.SENT}
    assert all(row.sent_at is not None and row.attempts == 1 for row in rows)
    assert all(row.last_error == "" for row in rows)


def test_one_relay_pass_publishes_two_tenants_rows_from_no_scope(
    tenant: Tenant, other_tenant: Tenant, event_queue: EventQueue
) -> None:
    """Row-level security: the relay learns which tenants have due rows
    (``audit_tenants_with_due_outbox``) and claims them in their scope, as a job
    that starts with none (docs/database-roles.md)."""
    appended = append_events(tenant=tenant, task_ids=[new_id()])
    appended += append_events(tenant=other_tenant, task_ids=[new_id()])
    with scope.unit_of_work(), broker_publisher() as publisher:
        report = relay.outbox_relay_once(publisher=publisher)
        assert scope.current() is None
    assert report == relay.RelayReport(claimed=2, sent=2)
    received = event_queue.drain(expected=2)
    assert {r.message_id for r in received} == {str(a.event_id) for a in appended}
    assert {r.headers["tenant_id"] for r in received} == {
        str(tenant.pk),
        str(other_tenant.pk),
    }


def test_claimed_rows_are_leased_away_from_other_relays(tenant: Tenant) -> None:
    """A claimed row is not claimed again while its lease runs, then it is."""
    append_events(tenant=tenant, task_ids=[None, None])
    first = relay.outbox_claim_batch(limit=10)
    assert len(first) == 2
    assert relay.outbox_claim_batch(limit=10) == []
    lease = settings.PORTAL_OUTBOX_CLAIM_LEASE_S
    with db_clock_offset(lease + 1):
        again = relay.outbox_claim_batch(limit=10)
    assert [m.id for m in again] == [m.id for m in first]
    assert [m.attempts for m in again] == [2, 2]


def test_relay_refuses_to_publish_inside_a_transaction(event_queue: EventQueue) -> None:
    """Publishing is network I/O: the relay refuses to run in an open transaction."""
    with (
        broker_publisher() as publisher,
        pytest.raises(TransactionForbidden),
        transaction.atomic(),
    ):
        relay.outbox_relay_once(publisher=publisher)


def test_claim_takes_a_task_prefix_and_holds_the_rest_behind_the_head(
    tenant: Tenant,
) -> None:
    """Per task only the oldest unsent row and the due rows right behind it are
    claimable; a second relay gets nothing of that task while the first holds it."""
    task_a, task_b = new_id(), new_id()
    append_events(tenant=tenant, task_ids=[task_a, task_b, task_a, task_a, task_b])
    first = relay.outbox_claim_batch(limit=2)  # head of A and head of B
    assert len(first) == 2
    assert relay.outbox_claim_batch(limit=10) == []  # the rest waits behind them
    # The heads are sent: their followers become claimable, in order.
    Outbox.objects.filter(pk__in=[m.id for m in first]).update(state="sent")
    rest = relay.outbox_claim_batch(limit=10)
    assert [m.task_id for m in rest] == [str(task_a), str(task_a), str(task_b)]


def test_four_relays_publish_2000_rows_once_each_in_task_order(
    tenant: Tenant, event_queue: EventQueue
) -> None:
    """Four relays (own connections) at once: every row is published exactly once in
    the normal path, and each task's messages arrive in event id order."""
    # given: 1,500 events spread over 8 tasks, 500 without a task, interleaved
    tasks = [new_id() for _ in range(8)]
    round_robin = itertools.cycle(tasks)
    task_ids = [None if i % 4 == 3 else next(round_robin) for i in range(2000)]
    appended = append_events(tenant=tenant, task_ids=task_ids)
    barrier = threading.Barrier(4, timeout=30)

    def relay_worker() -> relay.RelayReport:
        barrier.wait()
        return _relay_until_empty(limit=50)

    # when
    started = time.monotonic()
    outcomes = run_in_threads(*[relay_worker] * 4, timeout=120)
    elapsed = time.monotonic() - started

    # then
    for outcome in outcomes:
        assert isinstance(outcome, relay.RelayReport), outcome
    total = sum(outcomes, relay.RelayReport())
    assert (total.sent, total.failed, total.released) == (2000, 0, 0)
    received = event_queue.drain(expected=2000, timeout=60)
    counts = Counter(r.message_id for r in received)
    expected_ids = {str(a.event_id) for a in appended}
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    lost = expected_ids - set(counts)
    unexpected = set(counts) - expected_ids
    per_task: dict[str, list[uuid.UUID]] = defaultdict(list)
    for message in received:
        if message.body["task_id"]:
            per_task[message.body["task_id"]].append(uuid.UUID(message.message_id))
    order_violations = sum(ids != sorted(ids) for ids in per_task.values())
    lags = lag_ms()
    write_report(
        "worker-relay-concurrent",
        {
            "relays": 4,
            "rows": 2000,
            "tasks": len(tasks),
            "sent_per_relay": [o.sent for o in outcomes],
            "messages_received": len(received),
            "duplicates": duplicates,
            "lost": len(lost),
            "unexpected": len(unexpected),
            "order_violations": order_violations,
            "elapsed_s": round(elapsed, 2),
            "rows_per_s": round(2000 / elapsed),
            # Rows were written before the relays started: this is backlog drain lag.
            "lag_p50_ms": round(percentile(lags, 50), 1),
            "lag_p99_ms": round(percentile(lags, 99), 1),
        },
    )
    assert (duplicates, len(lost), len(unexpected)) == (0, 0, 0)
    assert order_violations == 0
    assert len(per_task) == 8
    # Nothing was claimed twice: one attempt per row.
    attempts = set(Outbox.objects.values_list("attempts", flat=True).distinct())
    assert attempts == {1}


def test_rows_committed_out_of_id_order_are_neither_skipped_nor_reordered(
    tenant: Tenant, event_queue: EventQueue
) -> None:
    """The outbox gap test (docs/outbox.md, "Tests"; smaller): eight writers hold each
    transaction open for a random while after the insert, so commits land out of id
    order, while two relays run. Every row is published exactly once and each task
    keeps its order."""
    rng = random.Random(20261130)
    print("seed 20261130")
    writers, per_writer = 8, 60
    delays = [[rng.uniform(0, 0.04) for _ in range(per_writer)] for _ in range(writers)]
    writer_tasks = [new_id() for _ in range(writers)]
    written: list[str] = []
    done = threading.Event()
    barrier = threading.Barrier(writers + 2, timeout=30)

    def writer(index: int) -> None:
        barrier.wait()
        for n in range(per_writer):
            with transaction.atomic(durable=True):
                event_id = audit_services.event_append(
                    tenant_id=tenant.pk,
                    code=EventCode.TASK_TRANSITIONED,
                    actor=Actor.system(f"writer-{index}"),
                    task_id=writer_tasks[index] if n % 3 else None,
                    data={"n": n},
                )
                time.sleep(delays[index][n])  # after the insert, before the commit
            written.append(str(event_id))

    def relay_worker() -> relay.RelayReport:
        barrier.wait()
        total = relay.RelayReport()
        with broker_publisher() as publisher:
            while True:
                report = relay.outbox_relay_once(publisher=publisher, limit=20)
                total += report
                if report.claimed:
                    continue
                if (
                    done.is_set()
                    and not Outbox.objects.filter(state="pending").exists()
                ):
                    return total
                time.sleep(0.005)

    def writers_then_done() -> None:
        try:
            outcomes = run_in_threads(
                *[lambda i=i: writer(i) for i in range(writers)], timeout=120
            )
            for outcome in outcomes:
                assert not isinstance(outcome, BaseException), outcome
        finally:
            done.set()

    outcomes = run_in_threads(
        writers_then_done, relay_worker, relay_worker, timeout=180
    )
    for outcome in outcomes:
        assert not isinstance(outcome, BaseException), outcome
    received = event_queue.drain(expected=len(written), timeout=60)
    seen = Counter(r.message_id for r in received)
    per_task: dict[str, list[uuid.UUID]] = defaultdict(list)
    for message in received:
        if message.body["task_id"]:
            per_task[message.body["task_id"]].append(uuid.UUID(message.message_id))
    lags = lag_ms()
    figures = {
        "writers": writers, "rows": len(written), "relays": 2,
        "skipped": len(set(written) - set(seen)),
        "unexpected": len(set(seen) - set(written)),
        "duplicates": sum(n - 1 for n in seen.values()),
        "order_violations": sum(ids != sorted(ids) for ids in per_task.values()),
        "lag_p50_ms": round(percentile(lags, 50), 1),
        "lag_p99_ms": round(percentile(lags, 99), 1),
        "lag_max_ms": round(lags[-1], 1) if lags else 0.0,
    }  # fmt: skip
    write_report("worker-relay-outbox-gap", figures)
    assert len(written) == writers * per_writer
    assert figures["skipped"] == figures["unexpected"] == figures["duplicates"] == 0
    assert figures["order_violations"] == 0
    assert len(per_task) == writers


def test_unreachable_broker_backs_off_to_a_cap_then_dead_then_retried(
    tenant: Tenant, event_queue: EventQueue, settings: Any
) -> None:
    """Failed publishes double the wait up to the cap; at the last attempt the row is
    dead and holds its task's later rows back; an operator's retry delivers all."""
    settings.PORTAL_OUTBOX_BACKOFF_BASE_S = 1.0
    settings.PORTAL_OUTBOX_BACKOFF_CAP_S = 4.0
    settings.PORTAL_OUTBOX_MAX_ATTEMPTS = 5
    task_id = new_id()
    head, follower, loner = append_events(
        tenant=tenant, task_ids=[task_id, task_id, None]
    )
    offset = 0.0
    with closed_port() as port:
        url = f"amqp://guest:guest@127.0.0.1:{port}//"
        with broker_publisher(url=url) as publisher:
            for attempt, wait in enumerate([1, 2, 4, 4, 4], start=1):
                with db_clock_offset(offset):
                    before = db_now()
                    report = relay.outbox_relay_once(publisher=publisher)
                    after = db_now()
                last = attempt == 5
                assert report == relay.RelayReport(
                    claimed=3, failed=2, dead=2 if last else 0, released=1,
                    broker_down=True,
                )  # fmt: skip
                for event in (head, loner):
                    row = Outbox.objects.get(event_id=event.event_id)
                    assert row.attempts == attempt
                    assert row.state == ("dead" if last else "pending")
                    wait_td = dt.timedelta(seconds=wait)
                    assert before + wait_td <= row.available_at <= after + wait_td
                    assert (
                        "refused" in row.last_error or "link failed" in row.last_error
                    )
                behind = Outbox.objects.get(event_id=follower.event_id)
                assert (behind.state, behind.attempts) == ("pending", 0)
                offset += wait + 1
        # One connection attempt per batch, never one per row.
        assert publisher.connect_attempts == 5

    with db_clock_offset(offset):
        # The broker is back, but the task's head is dead: its follower waits.
        with broker_publisher() as publisher:
            assert relay.outbox_relay_once(publisher=publisher).claimed == 0
        # An operator retries the dead rows; everything goes out, in order.
        moved = relay.outbox_retry_dead(tenant=tenant)
        assert moved == 2
        assert relay.outbox_retry_dead(tenant=tenant) == 0
        with broker_publisher() as publisher:
            report = relay.outbox_relay_once(publisher=publisher)
    assert report == relay.RelayReport(claimed=3, sent=3)
    received = [r.message_id for r in event_queue.drain(expected=3)]
    write_report(
        "worker-relay-backoff",
        {"messages": 3, "attempts_until_dead": 5, "waits_s": [1, 2, 4, 4, 4],
         "connect_attempts": 5, "dead": 2, "held_behind_dead": 1, "retried": moved,
         "delivered_after_retry": len(received), "duplicates": 0,
         "lost": 3 - len(set(received))},
    )  # fmt: skip
    # Wave 1: the head and the taskless row; wave 2: the follower, after its head.
    assert received == [str(e.event_id) for e in (head, loner, follower)]


def test_a_nacked_message_backs_off_and_holds_its_task_while_its_wave_goes_on(
    tenant: Tenant, amqp_url: str, events_exchange: str
) -> None:
    """RabbitMQ nacks what a full queue refuses (``x-overflow: reject-publish``). In
    one pipelined wave the acked row is sent and the nacked one backs off; its task's
    next row is held back, the other task's next row goes out (and is nacked too),
    the connection stays up; once there is room, the rest goes out in task order."""
    from kombu import Connection, Exchange, Queue

    exchange = Exchange(events_exchange, type="topic", durable=True)
    full = Queue(
        f"relaytest-full-{uuid.uuid4().hex[:8]}", exchange, routing_key="#",
        durable=True, queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"},
    )  # fmt: skip
    with Connection(amqp_url) as broker:
        full(broker.default_channel).declare()
    task_a, task_b = new_id(), new_id()
    a1, b1, a2, b2 = append_events(
        tenant=tenant, task_ids=[task_a, task_b, task_a, task_b]
    )
    queue = EventQueue(url=amqp_url, exchange=events_exchange)
    try:
        with broker_publisher() as publisher:
            # when: wave 1 is a1 (acked: the queue holds it) and b1 (nacked: full);
            # wave 2 is a2 (nacked) with b2 held behind b1
            report = relay.outbox_relay_once(publisher=publisher)
            assert report == relay.RelayReport(claimed=4, sent=1, failed=2, released=1)
            assert (publisher.acks, publisher.connect_attempts) == (1, 1)
            rows = {r.event_id: r for r in Outbox.objects.filter(tenant=tenant)}
            assert rows[a1.event_id].state == OutboxState.SENT
            for refused in (b1, a2):
                row = rows[refused.event_id]
                assert (row.state, row.attempts) == (OutboxState.PENDING, 1)
                assert "nack" in row.last_error
                assert row.available_at > db_now()  # backing off
            held = rows[b2.event_id]
            assert (held.state, held.attempts) == (OutboxState.PENDING, 0)

            # then: with room (an unbounded queue instead), the rest goes out in
            # order, on the same connection
            with Connection(amqp_url) as broker:
                full(broker.default_channel).delete()
            queue.declare()
            with db_clock_offset(60):
                report = relay.outbox_relay_once(publisher=publisher)
            assert report == relay.RelayReport(claimed=3, sent=3)
            assert publisher.connect_attempts == 1
        received = [r.message_id for r in queue.drain(expected=3)]
        assert received == [str(e.event_id) for e in (b1, a2, b2)]
    finally:
        queue.delete()
        with contextlib.suppress(Exception), Connection(amqp_url) as broker:
            full(broker.default_channel).delete()


def test_a_dead_row_of_another_tenant_is_not_retried(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    """``outbox_retry_dead`` only moves the given tenant's rows."""
    (event,) = append_events(tenant=other_tenant, task_ids=[None])
    Outbox.objects.filter(event_id=event.event_id).update(state="dead")
    row_id = Outbox.objects.get(event_id=event.event_id).pk
    assert relay.outbox_retry_dead(tenant=tenant, ids=[row_id]) == 0
    assert relay.outbox_retry_dead(tenant=other_tenant, ids=[row_id]) == 1


def test_a_commit_whose_process_dies_before_enqueueing_is_still_delivered(
    tenant: Tenant, event_queue: EventQueue, celery_test_queue: str, amqp_url: str
) -> None:
    """The business transaction commits and its process is SIGKILLed before the nudge
    is sent: nothing was enqueued, and the relay still delivers every row."""
    # when: a real process commits three events and dies in its first commit hook
    writer = subprocess.run(
        [PYTHON, "-m", "tests.worker.writer_process", str(tenant.pk), "3"],
        cwd=REPO,
        env=subprocess_env(amqp_url=amqp_url, exchange=event_queue.exchange.name),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert writer.returncode == -9, writer.stderr
    event_ids = json.loads(writer.stdout.splitlines()[0])["event_ids"]

    # then: committed, not nudged (its Celery broker is not the test's: see below)
    pending = Outbox.objects.filter(tenant=tenant, state=OutboxState.PENDING)
    assert sorted(pending.values_list("key", flat=True)) == sorted(event_ids)
    assert queued_messages(amqp_url, celery_test_queue) == []
    with broker_publisher() as publisher:
        report = relay.outbox_relay_once(publisher=publisher)
    assert report.sent == 3
    received = event_queue.drain(expected=3)
    assert sorted(r.message_id for r in received) == sorted(event_ids)
    lags = lag_ms()
    write_report(
        "worker-commit-then-die",
        {"messages": 3, "kills": 1, "nudges_sent": 0, "delivered": len(received),
         "duplicates": len(received) - len({r.message_id for r in received}),
         "lost": 3 - len({r.message_id for r in received}),
         "lag_p50_ms": round(percentile(lags, 50), 1),
         "lag_p99_ms": round(percentile(lags, 99), 1)},
    )  # fmt: skip


def test_nudge_enqueues_the_relay_job_after_commit_only(
    tenant: Tenant, celery_test_queue: str, amqp_url: str
) -> None:
    """A commit sends one ``relay_outbox_job``; a rollback sends nothing."""
    append_events(tenant=tenant, task_ids=[None], nudge=True)

    def nudge_then_fail() -> None:
        with transaction.atomic():
            relay.nudge_relay()
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        nudge_then_fail()
    messages = queued_messages(amqp_url, celery_test_queue)
    assert [m.headers["task"] for m in messages] == [relay.RELAY_JOB_NAME]
    assert messages[0].headers["expires"] is not None


def test_nudge_with_the_broker_down_never_raises_nor_blocks_the_commit(
    tenant: Tenant, caplog: pytest.LogCaptureFixture
) -> None:
    """With the Celery broker unreachable the write commits at once; a warning is
    logged, and further nudges are skipped for a moment."""
    from tests.support.broker import redirect_celery

    with closed_port() as port:
        redirect_celery(broker_url=f"amqp://guest:guest@127.0.0.1:{port}//", queue="x")
        started = time.monotonic()
        append_events(tenant=tenant, task_ids=[None], nudge=True)
        append_events(tenant=tenant, task_ids=[None], nudge=True)
        elapsed = time.monotonic() - started
    assert elapsed < 1.0
    assert Outbox.objects.filter(tenant=tenant).count() == 2
    warnings = [r for r in caplog.records if "could not nudge" in r.getMessage()]
    assert len(warnings) == 1  # the second nudge was skipped, not retried


def test_relay_job_is_registered_and_scheduled() -> None:
    """Beat runs the relay job every few seconds; the name resolves to the job."""
    from config.celery import app

    app.loader.import_default_modules()
    schedule = settings.CELERY_BEAT_SCHEDULE["relay-outbox"]
    assert schedule["task"] == relay.RELAY_JOB_NAME
    assert schedule["schedule"] <= 10
    job = app.tasks[relay.RELAY_JOB_NAME]
    assert job.acks_late and job.ignore_result
    assert job.soft_time_limit and job.time_limit
    assert job.soft_time_limit > settings.PORTAL_OUTBOX_RELAY_BUDGET_S


# --- The inbox ----------------------------------------------------------------------


def test_inbox_processes_a_message_id_once(inbox_consumer: str) -> None:
    """A second delivery of the same id is skipped; another consumer still runs it."""
    calls: list[str] = []
    run = lambda: calls.append("x")  # noqa: E731
    assert inbox_process_once(consumer=inbox_consumer, message_id="m1", handler=run)
    assert not inbox_process_once(consumer=inbox_consumer, message_id="m1", handler=run)
    assert calls == ["x"]


def test_inbox_handler_failure_records_nothing(inbox_consumer: str) -> None:
    """If the handler raises, the id is not recorded: the redelivery processes it."""

    def fail() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        raise ValueError("handler crashed")

    with pytest.raises(ValueError):
        inbox_process_once(consumer=inbox_consumer, message_id="m2", handler=fail)
    calls: list[int] = []
    assert inbox_process_once(
        consumer=inbox_consumer, message_id="m2", handler=lambda: calls.append(1)
    )
    assert calls == [1]


def test_inbox_two_consumers_racing_on_one_id_process_it_once(
    inbox_consumer: str,
) -> None:
    """Two concurrent deliveries of one id: one handler runs, the other is skipped."""
    barrier = threading.Barrier(2, timeout=10)
    calls: list[int] = []

    def slow_handler() -> None:
        calls.append(1)
        time.sleep(0.2)  # the other delivery arrives while this one is open

    def deliver() -> bool:
        barrier.wait()
        return inbox_process_once(
            consumer=inbox_consumer, message_id="m3", handler=slow_handler
        )

    outcomes = run_in_threads(deliver, deliver)
    assert sorted(outcomes) == [False, True]
    assert calls == [1]


def test_laptop_mode_publishes_through_kombus_filesystem_transport(
    tenant: Tenant, settings: Any, tmp_path: Any
) -> None:
    """Without a broker service (``filesystem://``) the relay still publishes, to the
    folders a filesystem consumer reads (no confirms: a synchronous file write)."""
    from kombu import Connection, Exchange, Queue

    folders: dict[str, Any] = {
        "data_folder_in": str(tmp_path / "queue"),
        "data_folder_out": str(tmp_path / "queue"),
        "control_folder": str(tmp_path / "control"),
        "processed_folder": str(tmp_path / "processed"),
        "store_processed": False,
    }
    settings.PORTAL_EVENTS_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = folders
    exchange = Exchange(settings.PORTAL_EVENTS_EXCHANGE, type="topic", durable=True)
    queue = Queue("laptop-consumer", exchange, routing_key="#")
    for folder in ("queue", "control", "processed"):
        (tmp_path / folder).mkdir()
    with Connection("filesystem://", transport_options=folders) as broker:
        queue(broker.default_channel).declare()
    (event,) = append_events(tenant=tenant, task_ids=[None])

    with broker_publisher() as publisher:
        report = relay.outbox_relay_once(publisher=publisher)

    assert report.sent == 1
    with Connection("filesystem://", transport_options=folders) as broker:
        message = queue(broker.default_channel).get(no_ack=True)
    assert message is not None
    assert message.properties["message_id"] == str(event.event_id)
    assert message.headers["tenant_id"] == str(tenant.pk)
