"""The relay's broker: publishes claimed outbox rows to RabbitMQ with confirms.

``BrokerPublisher`` is the ``audit.relay.Publisher`` the relay jobs use
(docs/outbox.md, "How the relay works"): a durable topic exchange, publisher
confirms matched by delivery tag, one connection per job run. The relay
(audit/relay.py) claims and records; this module only talks to the broker.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from django.conf import settings
from kombu import Connection, Exchange, Producer

from portal import tracing
from portal.tracing import Trace

from .exceptions import PublishFailed
from .relay import ClaimedMessage

logger = logging.getLogger(__name__)


def message_trace_headers(message: ClaimedMessage, *, exchange: str) -> dict[str, str]:
    """``traceparent`` of a PRODUCER span in the event's trace; {} without one."""
    with tracing.producer_span(
        f"{message.topic} publish",
        parent=Trace(trace_id=message.trace_id),
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.destination.name": exchange,
            "messaging.rabbitmq.destination.routing_key": message.topic,
            "messaging.message.id": message.key,
        },
    ) as headers:
        return headers


# --- AMQP 0-9-1 framing of basic.publish, a wave at a time --------------------------
# What py-amqp writes for kombu's ``Producer.publish`` of one outbox message (checked
# byte for byte against py-amqp's framing: tests/unit/audit/test_broker_frames.py),
# built for a whole wave and written once: py-amqp builds and writes each message's
# frames separately, about half of the relay's CPU per message before this.
_FRAME_END: Final = b"\xce"
_frame_head = struct.Struct(">BHI").pack
_content_head = struct.Struct(">HHQ").pack
_long = struct.Struct(">I").pack
# basic.publish (class 60, method 40), reserved short 0; the flags octet after the
# routing key: not mandatory, not immediate.
_PUBLISH_METHOD: Final = b"\x00\x3c\x00\x28\x00\x00"
# Property flags: content-type, content-encoding, headers, delivery-mode, priority,
# message-id, type, app-id (bits 15, 14, 13, 12, 11, 7, 5, 3): kombu's set.
_PROPERTY_FLAGS: Final = 0xF8A8
CONTENT_TYPE: Final = "application/json"
CONTENT_ENCODING: Final = "utf-8"
APP_ID: Final = "portal"
DELIVERY_MODE_PERSISTENT: Final = 2
PRIORITY: Final = 0  # kombu's default, sent explicitly


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"AMQP short string over 255 bytes: {text[:40]!r}...")
    return bytes((len(raw),)) + raw


_PROPERTIES_HEAD: Final = (
    struct.pack(">H", _PROPERTY_FLAGS) + _shortstr(CONTENT_TYPE)
    + _shortstr(CONTENT_ENCODING)
)  # fmt: skip
_DELIVERY_AND_PRIORITY: Final = bytes((DELIVERY_MODE_PERSISTENT, PRIORITY))
_APP_ID: Final = _shortstr(APP_ID)


def publish_frames(
    *,
    channel: int,
    exchange: str,
    messages: Sequence[tuple[str, str, Sequence[tuple[str, str]], str]],
    frame_max: int,
) -> bytes:
    """The frames of ``basic.publish`` for each ``(routing_key, message_id,
    headers, body)``, persistent JSON from ``portal``, the message's type its
    routing key; headers are string values. Bodies longer than ``frame_max - 8``
    are split across body frames, as py-amqp does."""
    chunk = frame_max - 8
    method_head = _PUBLISH_METHOD + _shortstr(exchange)
    parts: list[bytes] = []
    add = parts.append
    for routing_key, message_id, headers, text in messages:
        key = _shortstr(routing_key)
        method = method_head + key + b"\x00"
        add(_frame_head(1, channel, len(method)))
        add(method)
        add(_FRAME_END)
        table = b"".join(
            _shortstr(name) + b"S" + _long(len(raw)) + raw
            for name, value in headers
            for raw in (value.encode(),)
        )
        body = text.encode()
        header = b"".join((
            _content_head(60, 0, len(body)), _PROPERTIES_HEAD, _long(len(table)),
            table, _DELIVERY_AND_PRIORITY, _shortstr(message_id), key, _APP_ID,
        ))  # fmt: skip
        add(_frame_head(2, channel, len(header)))
        add(header)
        add(_FRAME_END)
        for start in range(0, len(body), chunk):
            piece = body[start : start + chunk]
            add(_frame_head(3, channel, len(piece)))
            add(piece)
            add(_FRAME_END)
    return b"".join(parts)


class _MeanwhileFailed(Exception):
    """What ``publish_wave``'s ``meanwhile`` raised, kept apart from the broker's
    failures (which become outcomes)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class BrokerPublisher:
    """Publishes outbox messages to a durable topic exchange through kombu.

    On AMQP (RabbitMQ) the channel is put in publisher-confirm mode
    (``confirm.select``) when it opens. ``publish_wave`` publishes the whole wave
    without waiting, then reads the broker's ``basic.ack``/``basic.nack`` frames
    (by delivery tag, ``multiple`` honoured) until every message of the wave is
    answered or ``timeout_s`` has passed. The connection is opened on the first
    wave, once, and dropped after any failure; the next wave opens a new one
    (``connect_attempts`` counts them, ``acks`` counts the messages the broker
    confirmed). kombu's filesystem transport (the laptop mode) has no confirms:
    each publish is a synchronous file write, done once it returns.
    """

    def __init__(
        self,
        *,
        url: str,
        exchange: str,
        timeout_s: float,
        transport_options: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.exchange = Exchange(exchange, type="topic", durable=True)
        self.timeout_s = timeout_s
        self.transport_options = dict(transport_options or {})
        self.confirms = not url.startswith("filesystem")
        self.connect_attempts = 0
        self.acks = 0
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        self._last_tag = 0  # the delivery tag of the channel's latest publish
        self._unanswered: set[int] = set()  # delivery tags published, not yet answered
        self._answers: dict[int, bool] = {}  # delivery tag -> acked (False: nacked)
        self._floor = 1  # every tag below it is answered
        self._channel_id = 0
        self._blocked: str | None = None  # the broker's connection.blocked reason

    def _open(self) -> Producer:
        if self._producer is not None:
            return self._producer
        self.connect_attempts += 1
        broker = Connection(
            self.url,
            transport_options=self.transport_options,
            connect_timeout=self.timeout_s,
        )
        try:
            # max_retries=0: one attempt; the relay's backoff is the retry policy.
            broker.ensure_connection(max_retries=0)
            channel: Any = broker.channel()  # py-amqp's Channel on AMQP
            if self.confirms:
                channel.confirm_select()  # delivery tags count from 1 on this channel
                channel.events["basic_ack"].add(self._on_ack)
                channel.events["basic_nack"].add(self._on_nack)
                # A resource alarm: RabbitMQ says connection.blocked once this
                # connection publishes (py-amqp advertises the capability).
                broker.connection.on_blocked = self._on_blocked
            producer = Producer(channel, exchange=self.exchange)
            self._channel_id = int(getattr(channel, "channel_id", 0) or 0)
        except BaseException:
            broker.release()
            raise
        self._connection, self._producer = broker, producer
        self._blocked = None
        self._last_tag, self._floor = 0, 1
        self._unanswered, self._answers = set(), {}
        return producer

    def _on_blocked(self, reason: str) -> None:
        self._blocked = reason

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._answer(delivery_tag, multiple, acked=True)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._answer(delivery_tag, multiple, acked=False)

    def _answer(self, delivery_tag: int, multiple: bool, *, acked: bool) -> None:
        # Tags below _floor are all answered (or given up): a ``multiple`` answer
        # scans from there, not the whole set, so a wave's answers cost O(wave).
        if multiple:
            start, self._floor = self._floor, max(self._floor, delivery_tag + 1)
            tags = [t for t in range(start, delivery_tag + 1) if t in self._unanswered]
        else:
            tags = [delivery_tag] if delivery_tag in self._unanswered else []
        for tag in tags:
            self._answers[tag] = acked
            self._unanswered.discard(tag)
        while self._floor <= self._last_tag and self._floor not in self._unanswered:
            self._floor += 1

    def _send(self, producer: Producer, message: ClaimedMessage) -> None:
        headers: dict[str, Any] = {"tenant_id": str(message.tenant_id)}
        # The event's trace (its id is in the envelope) goes on to the consumer.
        headers.update(message_trace_headers(message, exchange=self.exchange.name))
        producer.publish(
            message.body,
            routing_key=message.topic,
            content_type=CONTENT_TYPE,
            content_encoding=CONTENT_ENCODING,
            headers=headers,
            delivery_mode=DELIVERY_MODE_PERSISTENT,
            priority=PRIORITY,
            message_id=message.key,
            type=message.topic,
            app_id=APP_ID,
            retry=False,
            timeout=self.timeout_s,
        )

    def publish_wave(
        self,
        messages: Sequence[ClaimedMessage],
        *,
        meanwhile: Callable[[], None] | None = None,
    ) -> list[PublishFailed | None]:
        """Publish the messages in order, then wait for all their confirms.

        Returns one outcome per message: ``None`` when the broker acked it; a
        ``PublishFailed`` when it nacked it (``connection_lost`` False), when the
        channel failed (False) or the link failed, the broker blocked the
        connection (a memory or disk alarm: at once, not after the timeout) or no
        answer came within ``timeout_s`` (True) before its ack. After any failure but
        a nack the connection is dropped. ``meanwhile`` runs once the wave is
        written, before its confirms are awaited (not at all if the write failed);
        whatever it raises drops the connection and is raised.
        """
        outcomes: list[PublishFailed | None] = [None] * len(messages)
        tags: list[int] = []
        try:
            producer = self._open()
            if self.confirms:
                self._write(self._frames(messages))
                first = self._last_tag + 1
                self._last_tag += len(messages)
                tags = list(range(first, self._last_tag + 1))
                self._unanswered.update(tags)
                self._meanwhile(meanwhile)
                self._wait_for_answers()
            else:
                for message in messages:
                    self._send(producer, message)
                    tags.append(0)  # written: done (no confirms on this transport)
                self._meanwhile(meanwhile)
        except _MeanwhileFailed as failed:
            self.close(graceful=False)
            raise failed.error from None
        except Exception as error:  # noqa: BLE001
            failure = PublishFailed(
                f"{type(error).__name__}: {error}",
                connection_lost=self._is_connection_error(error),
            )
            self.close(graceful=False)
            for n in range(len(messages)):
                if not self.confirms and n < len(tags):
                    continue  # written to the file already: done
                if self.confirms and n < len(tags) and self._answers.get(tags[n]):
                    continue  # acked before the failure
                outcomes[n] = failure
        else:
            for n, tag in enumerate(tags if self.confirms else ()):
                if not self._answers[tag]:
                    outcomes[n] = PublishFailed(
                        "the broker refused the message (nack)", connection_lost=False
                    )
        finally:
            for tag in tags:
                self._answers.pop(tag, None)
                self._unanswered.discard(tag)
        if self.confirms:
            self.acks += sum(outcome is None for outcome in outcomes)
        return outcomes

    @staticmethod
    def _meanwhile(work: Callable[[], None] | None) -> None:
        if work is not None:
            try:
                work()
            except Exception as error:
                raise _MeanwhileFailed(error) from error  # not the broker's failure

    def _wait_for_answers(self) -> None:
        """Read frames until every published tag is acked or nacked.

        Raises:
            TimeoutError: no full answer within ``timeout_s``.
            ConnectionError: the broker blocked this connection (connection.blocked:
                a memory or disk alarm). The unanswered rest of the wave would wait
                for the alarm's end, and the relay's job with it; it backs off
                instead (tests/worker/test_broker_durability.py).
        """
        assert self._connection is not None
        deadline = time.monotonic() + self.timeout_s
        while self._unanswered:
            if self._blocked is not None:
                raise ConnectionError(
                    f"the broker blocked publishers (a resource alarm): {self._blocked}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no publisher confirm within {self.timeout_s} s")
            try:
                self._connection.drain_events(timeout=remaining)
            except TimeoutError:  # socket.timeout is TimeoutError
                continue  # the loop raises it with a clear message

    def _frames(self, messages: Sequence[ClaimedMessage]) -> bytes:
        """The wave as AMQP frames: what ``_send`` would write, message by message."""
        assert self._connection is not None
        amqp_connection: Any = self._connection.connection
        recorded = tracing.spans_recorded()
        wave = []
        for message in messages:
            headers = [("tenant_id", str(message.tenant_id))]
            # The event's trace (its id is in the envelope) goes on to the consumer.
            traceparent = None
            if not recorded:
                traceparent = tracing.unrecorded_traceparent(
                    Trace(trace_id=message.trace_id)
                )
            if traceparent is not None:
                headers.append(("traceparent", traceparent))
            else:  # a recorded span per message, or the event has no trace
                headers.extend(
                    message_trace_headers(message, exchange=self.exchange.name).items()
                )
            wave.append((message.topic, message.key, headers, message.body))
        return publish_frames(
            channel=self._channel_id,
            exchange=self.exchange.name,
            messages=wave,
            frame_max=amqp_connection.frame_max,
        )

    def _write(self, frames: bytes) -> None:
        """One write of a wave's frames, with the publish timeout (py-amqp's own
        ``basic_publish`` writes each message's frames the same way)."""
        assert self._connection is not None
        transport: Any = self._connection.connection.transport
        with transport.having_timeout(self.timeout_s):
            transport.write(frames)

    def _is_connection_error(self, error: Exception) -> bool:
        channel_errors: tuple[type[BaseException], ...] = ()
        if self._connection is not None:
            channel_errors = tuple(self._connection.channel_errors)
        # A channel error (e.g. a refused message) leaves the broker reachable.
        return not (channel_errors and isinstance(error, channel_errors))

    def close(self, *, graceful: bool = True) -> None:
        """Close the connection, waiting at most ``timeout_s`` for the broker's
        close-ok: py-amqp waits for it without a limit, so a link that went silent
        (a partition) held the relay's job forever
        (tests/worker/test_network_faults.py). After a failure (``graceful=False``)
        the socket is dropped without AMQP's close handshake: a broker under a
        resource alarm stops reading a publisher's socket and would never answer
        (tests/worker/test_broker_durability.py), and the wait would add to the
        confirm timeout already spent.
        """
        broker, self._connection, self._producer = self._connection, None, None
        if broker is None:
            return
        if not graceful:
            with contextlib.suppress(Exception):  # the link is already gone
                broker.collect()
            return
        try:
            transport: Any = getattr(broker.connection, "transport", None)
            if transport is None or not hasattr(transport, "having_timeout"):
                broker.release()  # no socket of its own (the filesystem transport)
            else:
                with transport.having_timeout(self.timeout_s):
                    broker.release()
        except Exception:  # the link is already gone; nothing to give back
            logger.debug("closing a failed broker connection", exc_info=True)
            broker.collect()  # drop what is left without asking the broker

    def __enter__(self) -> BrokerPublisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def broker_publisher(
    *, url: str | None = None, exchange: str | None = None
) -> Iterator[BrokerPublisher]:
    """A publisher configured from settings, closed on exit."""
    url = url or settings.PORTAL_EVENTS_BROKER_URL
    options: dict[str, Any] = {}
    if url.startswith("filesystem"):
        options = dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}))
        # kombu's filesystem transport does not create its folders.
        for key, value in options.items():
            if key.endswith("_folder") or key.startswith("data_folder_"):
                Path(value).mkdir(parents=True, exist_ok=True)
    publisher = BrokerPublisher(
        url=url,
        exchange=exchange or settings.PORTAL_EVENTS_EXCHANGE,
        timeout_s=settings.PORTAL_OUTBOX_CONFIRM_TIMEOUT_S,
        transport_options=options,
    )
    with publisher:
        yield publisher
