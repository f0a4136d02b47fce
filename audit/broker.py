"""The relay's broker: publishes claimed outbox rows to RabbitMQ with confirms.

``BrokerPublisher`` is the ``audit.relay.Publisher`` the relay jobs use
(docs/outbox.md, "How the relay works"): a durable topic exchange, publisher
confirms matched by delivery tag, one connection per job run. The relay
(audit/relay.py) claims and records; this module only talks to the broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from django.conf import settings
from kombu import Connection, Exchange, Producer

from portal import tracing
from portal.tracing import Trace

from .relay import ClaimedMessage, PublishFailed

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
            producer = Producer(channel, exchange=self.exchange)
        except BaseException:
            broker.release()
            raise
        self._connection, self._producer = broker, producer
        self._last_tag = 0
        self._unanswered, self._answers = set(), {}
        return producer

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._answer(delivery_tag, multiple, acked=True)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._answer(delivery_tag, multiple, acked=False)

    def _answer(self, delivery_tag: int, multiple: bool, *, acked: bool) -> None:
        if multiple:
            tags = {tag for tag in self._unanswered if tag <= delivery_tag}
        else:
            tags = {delivery_tag} & self._unanswered
        for tag in tags:
            self._answers[tag] = acked
        self._unanswered -= tags

    def _send(self, producer: Producer, message: ClaimedMessage) -> None:
        headers: dict[str, Any] = {"tenant_id": str(message.tenant_id)}
        # The event's trace (its id is in the envelope) goes on to the consumer.
        headers.update(message_trace_headers(message, exchange=self.exchange.name))
        producer.publish(
            message.body,
            routing_key=message.topic,
            content_type="application/json",
            content_encoding="utf-8",
            headers=headers,
            delivery_mode=2,  # persistent
            message_id=message.key,
            type=message.topic,
            app_id="portal",
            retry=False,
            timeout=self.timeout_s,
        )

    def publish_wave(
        self, messages: Sequence[ClaimedMessage]
    ) -> list[PublishFailed | None]:
        """Publish the messages in order, then wait for all their confirms.

        Returns one outcome per message: ``None`` when the broker acked it; a
        ``PublishFailed`` when it nacked it (``connection_lost`` False), when the
        channel failed (False) or the link failed or no answer came within
        ``timeout_s`` (True) before its ack. After any failure but a nack the
        connection is dropped.
        """
        outcomes: list[PublishFailed | None] = [None] * len(messages)
        tags: list[int] = []
        try:
            producer = self._open()
            for message in messages:
                self._send(producer, message)
                self._last_tag += 1
                tags.append(self._last_tag)
                if self.confirms:
                    self._unanswered.add(self._last_tag)
            if self.confirms:
                self._wait_for_answers(tags)
        except Exception as error:  # noqa: BLE001
            failure = PublishFailed(
                f"{type(error).__name__}: {error}",
                connection_lost=self._is_connection_error(error),
            )
            self.close()
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

    def _wait_for_answers(self, tags: Sequence[int]) -> None:
        """Read frames until every tag is acked or nacked.

        Raises:
            TimeoutError: no full answer within ``timeout_s``.
        """
        assert self._connection is not None
        deadline = time.monotonic() + self.timeout_s
        while not all(tag in self._answers for tag in tags):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no publisher confirm within {self.timeout_s} s")
            try:
                self._connection.drain_events(timeout=remaining)
            except TimeoutError:  # socket.timeout is TimeoutError
                continue  # the loop raises it with a clear message

    def _is_connection_error(self, error: Exception) -> bool:
        channel_errors: tuple[type[BaseException], ...] = ()
        if self._connection is not None:
            channel_errors = tuple(self._connection.channel_errors)
        # A channel error (e.g. a refused message) leaves the broker reachable.
        return not (channel_errors and isinstance(error, channel_errors))

    def close(self) -> None:
        broker, self._connection, self._producer = self._connection, None, None
        if broker is not None:
            try:
                broker.release()
            except Exception:  # the link is already gone; nothing to give back
                logger.debug("closing a failed broker connection", exc_info=True)

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
