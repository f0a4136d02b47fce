"""The relay ↔ RabbitMQ link under network faults (issue 25, R15).

The relay publishes to the machine's broker (its own exchange; the broker itself is
never touched) through a TCP fault proxy (tests/support/faultproxy.py). Latency only
slows it. A partition before connecting makes the run end within the confirm
timeout (``PORTAL_OUTBOX_CONFIRM_TIMEOUT_S``, also the connect timeout) + 1 s with
the broker down and every row still pending. A partition after the messages crossed
(the broker has them, its confirms are lost) ends with the rows unconfirmed, so not
``sent``, after one bounded wait (the confirms'; the connection it gives up is
dropped without a close handshake); once healed they are published again. The queue
then holds every row (nothing lost) and the lost-confirm wave twice at most, under
the same message id, for the consumer's inbox to drop (at least once, by design:
docs/outbox.md).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from kombu.utils.url import url_to_parts

from audit import relay
from audit.broker import broker_publisher
from audit.models import Outbox, OutboxState
from portal.models import Tenant
from tests.support.broker import EventQueue
from tests.support.faultproxy import FaultProxy

from .conftest import append_events, timed_drain

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT_S = 2.0


def test_the_relay_through_a_faulty_link_loses_nothing(
    tenant: Tenant, amqp_url: str, event_queue: EventQueue, settings: Any
) -> None:
    settings.PORTAL_OUTBOX_CONFIRM_TIMEOUT_S = TIMEOUT_S
    settings.PORTAL_OUTBOX_BACKOFF_BASE_S = 0.0  # a failed row is due again at once
    parts = url_to_parts(amqp_url)
    with FaultProxy((parts.hostname or "127.0.0.1", parts.port or 5672)) as proxy:
        settings.PORTAL_EVENTS_BROKER_URL = (
            f"amqp://{parts.username}:{parts.password}@127.0.0.1:{proxy.port}//"
        )

        # Latency: slower, all sent.
        proxy.latency_s = 0.02
        append_events(tenant=tenant, task_ids=[None] * 10)
        report, _ = timed_drain()
        assert (report.sent, report.broker_down) == (10, False), report
        proxy.latency_s = 0

        # Partitioned before connecting: bounded, broker down, rows wait.
        append_events(tenant=tenant, task_ids=[None] * 10)
        proxy.partition(True)
        report, took = timed_drain()
        assert report.broker_down and report.sent == 0, report
        assert took <= TIMEOUT_S + 1, took
        assert Outbox.objects.filter(state=OutboxState.PENDING).count() == 10
        proxy.partition(False)

        # Partitioned after the messages crossed: the confirms are lost.
        with broker_publisher() as publisher:
            append_events(tenant=tenant, task_ids=[None] * 3)
            opened = relay.outbox_relay_drain(publisher=publisher)
            assert opened.sent == 13, opened  # the 10 that waited, and 3 more
            append_events(tenant=tenant, task_ids=[None] * 10)
            proxy.drop_replies = True
            began = time.monotonic()
            lost_confirms = relay.outbox_relay_once(publisher=publisher)
            took = time.monotonic() - began
        assert lost_confirms.sent == 0 and lost_confirms.failed == 10, lost_confirms
        # One bounded wait, the confirms': the connection given up is dropped
        # without waiting for a close-ok (before audit/broker.py: forever).
        assert took <= TIMEOUT_S + 1, took
        proxy.drop_replies = False
        proxy.reset()

        healed, _ = timed_drain()
        assert healed.sent == 10, healed

    rows = set(Outbox.objects.filter(tenant=tenant).values_list("key", flat=True))
    assert set(
        Outbox.objects.filter(tenant=tenant).values_list("state", flat=True)
    ) == {OutboxState.SENT}
    received = event_queue.drain(expected=len(rows) + 10, timeout=30)
    seen = Counter(message.message_id for message in received)
    assert set(seen) == rows  # nothing lost, nothing unexpected
    twice = {key for key, n in seen.items() if n > 1}
    assert len(twice) <= 10 and all(n <= 2 for n in seen.values()), seen
