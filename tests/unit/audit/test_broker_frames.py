"""audit.broker.publish_frames writes, byte for byte, what kombu's Producer.publish
makes py-amqp write for the same outbox messages (its property set, its framing)."""

from __future__ import annotations

from typing import Any

import pytest
from amqp import Message
from amqp.method_framing import frame_writer
from amqp.serialization import dumps

from audit import broker

FRAME_MAX = 4096
CHANNEL = 1
EXCHANGE = "portal.events"
KEY = "0190f3a2-7c1e-7d4a-9b2f-3e5d6c7b8a90"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Written:
    """py-amqp's transport, as far as its frame writer uses it: what was written."""

    def __init__(self) -> None:
        self.frames = bytearray()

    def write(self, data: Any) -> None:
        self.frames += bytes(data)


class _Connection:
    frame_max = FRAME_MAX
    bytes_sent = 0


def py_amqp_frames(messages: list[tuple[str, str, list[tuple[str, str]], str]]) -> bytes:
    """What kombu's ``Producer.publish(body, routing_key=, content_type=,
    content_encoding=, headers=, delivery_mode=2, message_id=, type=, app_id=)``
    hands py-amqp (kombu.transport.pyamqp's prepare_message: an ``amqp.Message``
    with priority 0), framed by py-amqp's own writer."""
    written = _Written()
    write_frame = frame_writer(_Connection(), written)
    for routing_key, message_id, headers, body in messages:
        message = Message(
            body.encode(),
            priority=0,
            content_type="application/json",
            content_encoding="utf-8",
            application_headers=dict(headers),
            delivery_mode=2,
            message_id=message_id,
            type=routing_key,
            app_id="portal",
        )
        args = dumps("Bssbb", (0, EXCHANGE, routing_key, False, False))
        write_frame(1, CHANNEL, (60, 40), args, message)
    return bytes(written.frames)


WAVE = [
    ("task.transitioned", KEY, [("tenant_id", "t-1"), ("traceparent", TRACEPARENT)],
     '{"code": "task.transitioned", "data": {"n": 1}}'),
    ("operation.verified", KEY[::-1], [("tenant_id", "t-2")], '{"note": "caf\u00e9 \u2713"}'),
    ("task.registered", KEY, [("tenant_id", "t-3")], ""),
    # Longer than one frame: split across body frames as py-amqp does.
    ("connector.called", KEY, [("tenant_id", "t-4"), ("traceparent", TRACEPARENT)],
     '{"blob": "' + "x\u00e9" * 5000 + '"}'),
]  # fmt: skip


@pytest.mark.parametrize("n", range(len(WAVE)))
def test_each_message_is_framed_as_py_amqp_frames_it(n: int) -> None:
    one = [WAVE[n]]
    ours = broker.publish_frames(
        channel=CHANNEL, exchange=EXCHANGE, messages=one, frame_max=FRAME_MAX
    )
    assert ours == py_amqp_frames(one)


def test_a_wave_is_its_messages_frames_in_order() -> None:
    ours = broker.publish_frames(
        channel=CHANNEL, exchange=EXCHANGE, messages=WAVE, frame_max=FRAME_MAX
    )
    assert ours == py_amqp_frames(WAVE)
    assert ours.count(b"connector.called") == 2  # routing key and type, once each


def test_a_name_over_255_bytes_is_refused_not_cut() -> None:
    with pytest.raises(ValueError, match="short string"):
        broker.publish_frames(
            channel=CHANNEL,
            exchange=EXCHANGE,
            messages=[("t" * 256, KEY, [], "{}")],
            frame_max=FRAME_MAX,
        )
