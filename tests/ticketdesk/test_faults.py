"""Fault switches: each fails the way a real remote system does, observably.

The ledger (``desk.effects()``) tells what really happened behind each answer.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request

import pytest

from ticketdesk.harness import TicketDesk, TicketDeskError

from .conftest import BODY, call, create, lookup, token


def test_slow_answers_after_the_delay_and_creates(desk: TicketDesk) -> None:
    desk.set_fault("slow", delay_s=0.3)

    started = time.monotonic()
    reply = create(desk, "op-1")
    elapsed = time.monotonic() - started

    assert reply.status == 201
    assert elapsed >= 0.3
    assert desk.effects()["tickets_created"] == 1


def test_slow_still_creates_after_the_client_gave_up(desk: TicketDesk) -> None:
    desk.set_fault("slow", delay_s=0.5)

    with pytest.raises(TimeoutError):
        call(desk, "POST", "/tickets", body=BODY, bearer=token(desk), key="op-1",
             timeout=0.1)  # fmt: skip
    deadline = time.monotonic() + 5
    while desk.effects()["tickets_created"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)

    assert desk.effects()["tickets_created"] == 1
    assert len(lookup(desk, "idempotency_key=op-1").body["tickets"]) == 1


def test_execute_then_drop_creates_but_http_client_gets_no_reply(
    desk: TicketDesk,
) -> None:
    desk.set_fault("execute_then_drop")

    with pytest.raises(http.client.RemoteDisconnected):
        create(desk, "op-1")

    assert desk.effects()["tickets_created"] == 1
    # Recovery: the lookup finds exactly one receipt, and a retry with the same
    # key replays it without a second ticket.
    found = lookup(desk, "idempotency_key=op-1").body["tickets"]
    assert [ticket["ticket_id"] for ticket in found] == ["TCK-000001"]
    assert create(desk, "op-1").body == found[0]
    assert desk.effects()["tickets_created"] == 1


def test_execute_then_drop_is_a_connection_error_for_urllib(desk: TicketDesk) -> None:
    desk.set_fault("execute_then_drop")
    request = urllib.request.Request(
        f"{desk.url}/tickets",
        data=json.dumps(BODY).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {token(desk)}",
            "Idempotency-Key": "op-1",
            "Content-Type": "application/json",
        },
    )

    # urllib wraps only errors of sending in URLError; an empty reply comes through
    # as http.client's own error, a ConnectionResetError.
    with pytest.raises(http.client.RemoteDisconnected) as caught:
        urllib.request.urlopen(request, timeout=10)

    assert isinstance(caught.value, ConnectionResetError)
    assert desk.effects()["tickets_created"] == 1


def test_duplicate_makes_two_tickets_for_one_key(desk: TicketDesk) -> None:
    desk.set_fault("duplicate")

    reply = create(desk, "op-1")
    found = lookup(desk, "idempotency_key=op-1").body["tickets"]

    assert reply.status == 201
    assert [ticket["ticket_id"] for ticket in found] == ["TCK-000001", "TCK-000002"]
    effects = desk.effects()
    assert effects["tickets_created"] == 2
    assert effects["by_idempotency_key"] == {"op-1": 2}
    # A replay answers the first ticket and adds nothing.
    assert create(desk, "op-1").body["ticket_id"] == "TCK-000001"
    assert desk.effects()["tickets_created"] == 2


@pytest.mark.parametrize(
    ("mode", "status", "error"),
    [
        ("error_5xx", 503, "unavailable"),
        ("rate_limited", 429, "rate_limited"),
        ("reject", 422, "rejected"),
    ],
)
def test_refusing_faults_do_nothing(
    desk: TicketDesk, mode: str, status: int, error: str
) -> None:
    desk.set_fault(mode)

    refused = create(desk, "op-1")
    retried = create(desk, "op-1")

    assert (refused.status, refused.body["error"]) == (status, error)
    assert retried.status == 201  # the key was not taken by the refused request
    assert desk.effects()["tickets_created"] == 1


def test_rate_limited_sends_retry_after(desk: TicketDesk) -> None:
    desk.set_fault("rate_limited")
    desk.set_fault("rate_limited", retry_after_s=7)

    first = create(desk, "op-1")
    second = create(desk, "op-1")

    assert (first.status, first.headers["retry-after"]) == (429, "1")
    assert (second.status, second.headers["retry-after"]) == (429, "7")
    assert desk.effects()["tickets_created"] == 0


def test_after_5xx_answers_500_after_the_side_effect(desk: TicketDesk) -> None:
    desk.set_fault("after_5xx")

    reply = create(desk, "op-1")

    assert (reply.status, reply.body["error"]) == (500, "internal")
    assert desk.effects()["tickets_created"] == 1
    assert len(lookup(desk, "idempotency_key=op-1").body["tickets"]) == 1


def test_lookup_5xx_fails_lookups_only(desk: TicketDesk) -> None:
    desk.set_fault("lookup_5xx")

    created = create(desk, "op-1")
    failed = lookup(desk, "idempotency_key=op-1")
    answered = lookup(desk, "idempotency_key=op-1")

    assert created.status == 201
    assert (failed.status, failed.body["error"]) == (503, "unavailable")
    assert answered.status == 200
    assert len(answered.body["tickets"]) == 1


def test_lookup_slow_delays_lookups(desk: TicketDesk) -> None:
    desk.set_fault("lookup_slow", delay_s=0.3)

    started = time.monotonic()
    reply = call(desk, "GET", "/tickets/TCK-000001", bearer=token(desk, use="lookup"))

    assert reply.status == 404
    assert time.monotonic() - started >= 0.3


def test_times_counts_requests(desk: TicketDesk) -> None:
    desk.set_fault("error_5xx", times=2)

    statuses = [create(desk, "op-1").status for _ in range(3)]

    assert statuses == [503, 503, 201]
    assert desk.effects()["tickets_created"] == 1


def test_times_zero_lasts_until_cleared(desk: TicketDesk) -> None:
    desk.set_fault("reject", times=0)

    statuses = [create(desk, "op-1").status for _ in range(4)]
    desk.clear_faults()

    assert statuses == [422] * 4
    assert create(desk, "op-1").status == 201


def test_faults_queue_in_order_per_kind_of_request(desk: TicketDesk) -> None:
    desk.set_fault("error_5xx")
    desk.set_fault("lookup_5xx")
    desk.set_fault("execute_then_drop")

    assert create(desk, "op-1").status == 503
    assert lookup(desk, "idempotency_key=op-1").status == 503
    with pytest.raises(http.client.RemoteDisconnected):
        create(desk, "op-1")
    assert len(lookup(desk, "idempotency_key=op-1").body["tickets"]) == 1


def test_armed_faults_are_listed_and_cleared(desk: TicketDesk) -> None:
    desk.set_fault("slow", times=3, delay_s=0.2)

    listed = call(desk, "GET", "/_control/faults").body["faults"]
    desk.clear_faults()

    assert listed == [
        {"mode": "slow", "times": 3, "used": 0, "delay_s": 0.2, "retry_after_s": 1}
    ]
    assert call(desk, "GET", "/_control/faults").body == {"faults": []}


@pytest.mark.parametrize(
    "spec",
    [
        {"mode": "explode"},
        {"mode": "slow", "times": -1},
        {"mode": "slow", "times": True},
        {"mode": "slow", "delay_s": "1"},
        {"mode": "slow", "delay_s": 1000},
        {"mode": "rate_limited", "retry_after_s": 1.5},
    ],
)
def test_invalid_fault_is_refused(desk: TicketDesk, spec: dict[str, object]) -> None:
    reply = call(desk, "POST", "/_control/faults", body=spec)

    assert (reply.status, reply.body["error"]) == (400, "invalid_request")
    assert call(desk, "GET", "/_control/faults").body == {"faults": []}


def test_harness_raises_on_an_invalid_fault(desk: TicketDesk) -> None:
    with pytest.raises(TicketDeskError, match="400"):
        desk.set_fault("explode")


def test_a_refused_request_uses_up_the_fault(desk: TicketDesk) -> None:
    desk.set_fault("execute_then_drop")

    refused = create(desk, "op-1", exp=1)
    created = create(desk, "op-1")

    assert (refused.status, refused.body["error"]) == (401, "credential_expired")
    assert created.status == 201
    assert desk.effects()["tickets_created"] == 1


def test_answering_faults_act_before_the_credential_check(desk: TicketDesk) -> None:
    desk.set_fault("error_5xx")

    reply = call(desk, "POST", "/tickets", body=BODY)

    assert reply.status == 503
