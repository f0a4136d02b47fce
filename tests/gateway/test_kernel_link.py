"""The portal ↔ ticket desk link cut by the kernel mid-call (issue 25, R15).

The desk runs on a machine of its own: a network namespace reached over a veth pair
(tests/support/netns.py), listening on its end. The link is cut after the create
request has reached the desk and before its answer leaves (a 1 s ``slow`` fault
holds the answer): every packet in or out of the desk's machine is dropped, so the
portal's connection hears nothing, no reset, no close. The call ends ``unknown``
within its deadline (connect + read timeout) + 1 s; the desk makes the ticket
anyway. Healed, recovery's lookup under the operation's own key finds it: verified,
one ticket on the desk's own ledger, never a second create.

tests/gateway/test_network_faults.py has the same cases through a user-space proxy.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from audit.models import Event
from tasks.gateway import operation_recover
from tasks.models import Operation
from tests.gateway.conftest import World
from tests.support import netns
from tests.support.outbound import allow as outbound_allow
from ticketdesk.harness import TicketDesk, start_ticketdesk

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def link() -> Iterator[netns.Link]:
    netns.require()
    with netns.remote_link() as made:
        yield made


@pytest.fixture(scope="module")
def remote_desk(link: netns.Link) -> Iterator[TicketDesk]:
    """The real desk process, started inside the namespace on its address."""
    with start_ticketdesk(host=link.inner, netns=link.netns) as running:
        yield running


@pytest.fixture
def desk(
    remote_desk: TicketDesk,
    link: netns.Link,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[TicketDesk]:
    """The world's desk (tests/gateway/conftest.py) is the one across the link."""
    outbound_allow(settings, monkeypatch, remote_desk.url)
    settings.PORTAL_RECOVERY_BACKOFF_S = 0  # recovery may look again at once
    remote_desk.reset()
    yield remote_desk
    link.heal()
    remote_desk.clear_faults()


def test_a_kernel_cut_mid_call_is_unknown_in_time_then_one_ticket_by_the_key(
    world: World, link: netns.Link
) -> None:
    # Given: a started task whose create call the desk holds for a second.
    started = world.start_task()
    operation_id = started["operation"]["id"]
    world.desk.set_fault("slow", delay_s=1.0)
    cut_at: list[float] = []

    def cut_once_arrived() -> None:
        deadline = time.monotonic() + 10
        while world.desk.effects()["create_requests"] == 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        link.cut()  # the request is on the desk; its answer is not out yet
        cut_at.append(time.monotonic())

    # When: the link is cut while the call waits for the answer.
    cutter = threading.Thread(target=cut_once_arrived)
    cutter.start()
    began = time.monotonic()
    answer = world.execute(started)
    took = time.monotonic() - began
    cutter.join()

    # Then: the call ended unknown within its deadline + 1 s, by the read timeout.
    assert cut_at, "the create request never reached the desk"
    limit_s = world.connector.connect_timeout_s + world.connector.read_timeout_s + 1
    assert answer.json()["outcome"] == "unknown", answer.text
    [call, *_] = (
        Event.objects.filter(operation_id=operation_id, code="connector.called")
        .order_by("id")
        .values_list("payload", flat=True)
    )
    assert call["outcome"] == "unknown" and "ReadTimeout" in call["error"], call
    assert call["duration_ms"] <= limit_s * 1000, call
    # The call, the inline lookup (its connect times out) and the notice: bounded.
    assert took <= 3 * limit_s, took
    print(f"kernel cut mid-call: unknown after {call['duration_ms']} ms")

    # Healed: the desk made the ticket while cut off; the lookup finds it by key.
    link.heal()
    deadline = time.monotonic() + 10
    while world.tickets() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    result = operation_recover(
        tenant=world.tenant, operation_id=uuid.UUID(operation_id)
    )
    assert result.outcome == "verified", result
    operation = Operation.objects.get(pk=operation_id)
    [ticket] = world.desk.tickets()
    assert ticket["idempotency_key"] == started["operation"]["idempotency_key"]
    assert (operation.state, operation.provider_reference, operation.attempts) == (
        "verified",
        ticket["ticket_id"],
        1,
    )
    effects = world.desk.effects()
    assert (effects["tickets_created"], effects["create_requests"]) == (1, 1)


def test_random_loss_slows_calls_but_each_ends_in_time_with_one_ticket_per_key(
    world: World, link: netns.Link
) -> None:
    """A share of the packets into the desk's machine dropped at random (nft
    ``numgen``; ``tc netem`` is missing here): TCP retransmits, a call may be
    slower or end ``unknown`` at its deadline, never later; recovery settles those
    by their key, and the desk holds one ticket per operation."""
    calls = int(os.environ.get("PORTAL_LOSS_CALLS", "3"))
    percent = int(os.environ.get("PORTAL_LOSS_PERCENT", "20"))
    limit_s = world.connector.connect_timeout_s + world.connector.read_timeout_s + 1
    # Given: the link loses packets; When: the agent's operations run across it.
    link.lose(percent)
    started = [world.start_task(2000 + n) for n in range(calls)]
    outcomes = [world.execute(task).json()["outcome"] for task in started]
    link.heal()

    # Then: each call ended within its deadline + 1 s.
    durations = [
        payload["duration_ms"]
        for payload in Event.objects.filter(
            tenant=world.tenant, code="connector.called"
        ).values_list("payload", flat=True)
    ]
    assert durations and max(durations) <= limit_s * 1000, durations
    # Healed: whatever could not tell is settled by its key; one ticket each.
    for task, outcome in zip(started, outcomes, strict=True):
        if outcome != "verified":
            result = operation_recover(
                tenant=world.tenant, operation_id=uuid.UUID(task["operation"]["id"])
            )
            assert result.outcome == "verified", result
    keys = [task["operation"]["idempotency_key"] for task in started]
    assert sorted(t["idempotency_key"] for t in world.desk.tickets()) == sorted(keys)
    assert world.desk.effects()["tickets_created"] == calls
    print(
        f"{percent}% loss: {calls} calls, {outcomes.count('verified')} verified at"
        f" once, slowest call {max(durations)} ms"
    )
