#!/usr/bin/env python3
"""An example consumer of the portal's events that processes each message once.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/portal \\
    .venv/bin/python examples/outbox_consumer.py \\
        --broker amqp://guest:guest@127.0.0.1:5672// --queue example-events

It binds a durable quorum queue to the ``portal.events`` topic exchange (routing key
``#``: every event code) and, for each message, counts it per topic in its own table
``example_topic_count``, through the inbox (audit/inbox.py): the message id and the
count commit in one transaction, and the message is acked only after that commit.
The relay delivers at least once, so the same message id may arrive twice; the
second delivery is acked and skipped. ``--json`` prints one line per delivery
(message id, topic, redelivered flag, processed or duplicate, the trace id it was
processed in) for scripts and tests. Each delivery is processed in a CONSUMER span
that continues the event's trace from the message's ``traceparent`` header
(docs/observability.md); spans are exported when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set.

Bind the queue before the events you need are published: a topic exchange drops
messages that match no queue (docs/outbox.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

# Run as a script: the repository is the import root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from kombu import Connection, Consumer, Exchange, Queue  # noqa: E402
from kombu.message import Message  # noqa: E402

from audit.inbox import inbox_process_once  # noqa: E402
from portal import telemetry, tracing  # noqa: E402

logger = logging.getLogger("outbox_consumer")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS example_topic_count (
    consumer varchar(100) NOT NULL,
    topic varchar(100) NOT NULL,
    messages bigint NOT NULL,
    PRIMARY KEY (consumer, topic)
)
"""

_COUNT = """
INSERT INTO example_topic_count (consumer, topic, messages) VALUES (%s, %s, 1)
ON CONFLICT (consumer, topic)
DO UPDATE SET messages = example_topic_count.messages + 1
"""


@dataclass(kw_only=True)
class ConsumeStats:
    delivered: int = 0
    processed: int = 0
    duplicates: int = 0
    redelivered: int = 0  # the broker's redelivered flag (this consumer's own retries)
    rejected: int = 0  # no message id: cannot be deduplicated

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def ensure_schema() -> None:
    """Create this example's own business table (a real consumer migrates it).

    Only when it is missing: the portal's app role may not create tables
    (docs/database-roles.md), so against the portal's database the owner makes it
    first, as ``tests/worker/conftest.py`` does.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('example_topic_count') IS NOT NULL")
        if not cursor.fetchone()[0]:
            cursor.execute(_SCHEMA)


def count_by_topic(*, consumer: str, topic: str) -> None:
    """The example's business effect: one more message of ``topic``."""
    with connection.cursor() as cursor:
        cursor.execute(_COUNT, [consumer, topic])


def handle(
    message: Message,
    *,
    consumer: str,
    stats: ConsumeStats,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Process one delivery through the inbox, then ack it."""
    message_id = message.properties.get("message_id")
    topic = message.delivery_info.get("routing_key", "")
    redelivered = bool(message.delivery_info.get("redelivered"))
    stats.delivered += 1
    stats.redelivered += redelivered
    if not message_id:
        logger.error("message without message_id on %s: rejected", topic)
        stats.rejected += 1
        message.reject(requeue=False)
        return
    # A CONSUMER span continuing the event's trace from the message's traceparent.
    with tracing.consumer_span(
        f"{topic} process",
        headers=message.headers,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.message.id": message_id,
            "messaging.consumer.group.name": consumer,
        },
    ):
        trace_id = tracing.Trace.current().trace_id
        processed = inbox_process_once(
            consumer=consumer,
            message_id=message_id,
            handler=lambda: count_by_topic(consumer=consumer, topic=topic),
        )
        # Only now: a crash before this line means a redelivery, which the inbox
        # absorbs.
        message.ack()
    if processed:
        stats.processed += 1
    else:
        stats.duplicates += 1
    logger.info(
        "%s %s %s", "processed" if processed else "duplicate", topic, message_id
    )
    if report is not None:
        report(
            {
                "message_id": message_id,
                "topic": topic,
                "tenant_id": (message.headers or {}).get("tenant_id"),
                "redelivered": redelivered,
                "processed": processed,
                # The trace this delivery was processed in (from its traceparent).
                "trace_id": trace_id,
            }
        )


def consume(
    *,
    broker_url: str,
    queue: str,
    exchange: str,
    routing_key: str = "#",
    consumer: str | None = None,
    idle_exit_s: float | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> ConsumeStats:
    """Consume ``queue`` (declared and bound here) until idle for ``idle_exit_s``."""
    consumer = consumer or queue
    stats = ConsumeStats()
    events = Exchange(exchange, type="topic", durable=True)
    # A quorum queue: replicated, and fsynced before the broker confirms a publish,
    # so a broker restart loses nothing it confirmed (docs/outbox.md).
    bound = Queue(
        queue,
        events,
        routing_key=routing_key,
        durable=True,
        queue_arguments={"x-queue-type": "quorum"},
    )
    idle = 0.0
    with Connection(broker_url) as broker:
        channel = broker.channel()
        with Consumer(
            channel,
            queues=[bound],
            on_message=lambda message: handle(
                message, consumer=consumer, stats=stats, report=report
            ),
            prefetch_count=50,
        ):
            while not should_stop():
                try:
                    broker.drain_events(timeout=1)
                    idle = 0.0
                except TimeoutError:  # socket.timeout is an alias
                    idle += 1
                    if idle_exit_s is not None and idle >= idle_exit_s:
                        break
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--broker", default=settings.PORTAL_EVENTS_BROKER_URL, help="broker URL"
    )
    parser.add_argument(
        "--queue", default="example-events", help="durable quorum queue"
    )
    parser.add_argument("--exchange", default=settings.PORTAL_EVENTS_EXCHANGE)
    parser.add_argument("--routing-key", default="#", help="event codes to bind")
    parser.add_argument("--consumer", help="inbox consumer name (default: the queue)")
    parser.add_argument(
        "--idle-exit", type=float, help="exit after this many seconds without messages"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON line per delivery"
    )
    args = parser.parse_args(argv)
    telemetry.setup("outbox-consumer")
    logging.basicConfig(
        level=logging.WARNING if args.json else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    ensure_schema()

    def print_line(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)

    try:
        stats = consume(
            broker_url=args.broker,
            queue=args.queue,
            exchange=args.exchange,
            routing_key=args.routing_key,
            consumer=args.consumer,
            idle_exit_s=args.idle_exit,
            report=print_line if args.json else None,
            should_stop=lambda: stopping,
        )
    except KeyboardInterrupt:
        return 130
    summary = {"summary": stats.as_json()}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
