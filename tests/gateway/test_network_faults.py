"""The portal ↔ ticket desk link under network faults (issue 25, R15).

The connector reaches the real desk through a TCP fault proxy
(tests/support/faultproxy.py): latency, a partition before the request, a partition
after it crossed (the desk acts, the answer is lost), connections reset mid-call.
Each wait ends within its configured timeout + 1 s (connect 1 s, read 2 s, and the
call's deadline of both: tests/gateway/conftest.py's connector), a call that cannot
tell ends ``unknown`` (the takeover path's start), and once the link heals the
recovery protocol settles it by the operation's own key: one ticket on the desk's
ledger, never a second.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from audit.models import Event
from tasks import services as task_services
from tasks.gateway import operation_recover
from tasks.models import Operation
from tests.gateway.conftest import World
from tests.support.faultproxy import FaultProxy
from tests.support.outbound import allow as outbound_allow

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxy(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FaultProxy]:
    """The world's connector, pointed at the desk through a fault proxy."""
    desk = httpx.URL(world.desk.url)
    with FaultProxy((desk.host, desk.port or 80)) as running:
        outbound_allow(settings, monkeypatch, running.url())
        world.connector = task_services.connector_save(
            tenant=world.tenant,
            target=world.connector.target,
            values={"base_url": running.url()},
        )
        settings.PORTAL_RECOVERY_BACKOFF_S = 0  # recovery may look again at once
        yield running


def called(operation_id: str) -> list[dict[str, Any]]:
    return list(
        Event.objects.filter(operation_id=operation_id, code="connector.called")
        .order_by("id")
        .values_list("payload", flat=True)
    )


def limit_s(world: World) -> float:
    """The longest a call may take: its deadline (connect + read) and 1 s."""
    return world.connector.connect_timeout_s + world.connector.read_timeout_s + 1


def settle(world: World, operation_id: str) -> Operation:
    """Recovery, as the settle job runs it, once the link is whole again."""
    result = operation_recover(
        tenant=world.tenant, operation_id=uuid.UUID(operation_id)
    )
    assert result.outcome == "verified", result
    return Operation.objects.get(pk=operation_id)


def test_latency_under_the_timeouts_is_only_slower(
    world: World, proxy: FaultProxy
) -> None:
    proxy.latency_s = 0.3  # each way: 0.6 s a round trip, under the 2 s read timeout
    started = world.start_task()

    answer = world.execute(started)

    assert answer.json()["outcome"] == "verified", answer.text
    [call] = called(started["operation"]["id"])
    assert 600 <= call["duration_ms"] <= limit_s(world) * 1000, call
    assert world.tickets() == 1


def test_a_lost_answer_is_unknown_then_settled_by_the_key(
    world: World, proxy: FaultProxy
) -> None:
    """The partition falls after the request crossed: the desk makes the ticket,
    no answer comes back, the call and the inline lookup time out: ``unknown``.
    Healed, recovery finds the ticket by the key: verified, still one ticket."""
    started = world.start_task()
    operation_id = started["operation"]["id"]
    proxy.drop_replies = True

    began = time.monotonic()
    answer = world.execute(started)
    took = time.monotonic() - began

    assert answer.json()["outcome"] == "unknown", answer.text
    [call] = called(operation_id)
    assert call["outcome"] == "unknown" and "ReadTimeout" in call["error"], call
    assert call["duration_ms"] <= limit_s(world) * 1000, call
    # The call, the inline lookup and the revocation notice: each bounded.
    assert took <= 3 * limit_s(world), took
    assert world.tickets() == 1  # the desk acted

    proxy.drop_replies = False
    operation = settle(world, operation_id)

    [ticket] = world.desk.tickets()
    assert operation.provider_reference == ticket["ticket_id"]
    assert operation.attempts == 1  # found by the key, never called again
    assert world.desk.effects()["create_requests"] == 1


def test_a_partition_before_the_call_ends_unknown_and_the_retry_is_the_same_key(
    world: World, proxy: FaultProxy
) -> None:
    """The link is down before connecting: the connect waits its timeout, nothing
    reaches the desk, the operation is ``unknown``. Healed, recovery's lookup finds
    nothing, so the call is made again under the same key: one ticket."""
    started = world.start_task()
    operation_id = started["operation"]["id"]
    proxy.partition(True)

    answer = world.execute(started)

    assert answer.json()["outcome"] == "unknown", answer.text
    [call] = called(operation_id)
    assert call["outcome"] == "unknown" and "ConnectTimeout" in call["error"], call
    assert call["duration_ms"] <= (world.connector.connect_timeout_s + 1) * 1000
    assert world.desk.effects()["requests"] == 0

    proxy.partition(False)
    operation = settle(world, operation_id)

    [ticket] = world.desk.tickets()
    assert ticket["idempotency_key"] == started["operation"]["idempotency_key"]
    assert (operation.attempts, operation.provider_reference) == (
        2,
        ticket["ticket_id"],
    )
    assert [c["outcome"] for c in called(operation_id)] == ["unknown", "succeeded"]


def test_a_connection_reset_mid_call_is_unknown_and_one_ticket(
    world: World, proxy: FaultProxy
) -> None:
    """The desk is working on the request (a 1 s slow fault) when the link resets
    every connection: the call ends at once with ``unknown``; the ticket is made
    anyway; recovery finds it."""
    started = world.start_task()
    operation_id = started["operation"]["id"]
    world.desk.set_fault("slow", delay_s=1.0)

    def cut_once_sent() -> None:
        deadline = time.monotonic() + 10
        while proxy.bytes_up == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        proxy.reset()

    cutter = threading.Thread(target=cut_once_sent)
    cutter.start()
    answer = world.execute(started)
    cutter.join()

    [call, *_] = called(operation_id)
    assert call["outcome"] == "unknown", call
    assert call["duration_ms"] < 1000, call  # cut, not timed out
    deadline = time.monotonic() + 10
    while world.tickets() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # the slow request finishes on the desk
    if answer.json()["outcome"] != "verified":  # the inline lookup came too early
        settle(world, operation_id)
    operation = Operation.objects.get(pk=operation_id)
    [ticket] = world.desk.tickets()
    assert (operation.state, operation.provider_reference) == (
        "verified",
        ticket["ticket_id"],
    )
    assert world.desk.effects()["tickets_created"] == 1
