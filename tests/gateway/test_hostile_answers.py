"""Hostile remote answers (issue 25, R17 as this design has it: the remote does not
sign its receipts, the portal looks them up by its own key).

The real ticket desk makes the ticket, then answers in a way no client should
trust (its fault modes: ticketdesk/README.md): a redirect, a body far over the
connector's limit, a cut-off JSON body, a receipt for another key or another
tenant, an answer dripped a byte at a time. Each time the call is ``unknown`` with
a fixed reason in the ``connector.called`` event (tasks/connectors.py), the inline
recovery looks the receipt up by the operation's key, finds the one ticket and
verifies it: one ticket on the desk's ledger, never a second call.
"""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import Event
from tasks import connectors
from tasks.models import Operation
from tests.gateway.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def payloads(operation_id: str, code: str) -> list[dict[str, Any]]:
    return list(
        Event.objects.filter(operation_id=operation_id, code=code)
        .order_by("id")
        .values_list("payload", flat=True)
    )


@pytest.mark.parametrize(
    ("mode", "status", "error"),
    [
        ("redirect", 303, connectors.REDIRECT_NOT_FOLLOWED),
        ("oversize", 201, connectors.ANSWER_TOO_LARGE),
        ("malformed", 201, connectors.NO_RECEIPT),
        ("foreign_key", 201, connectors.RECEIPT_OTHER_KEY),
        ("foreign_tenant", 201, connectors.RECEIPT_OTHER_TENANT),
    ],
)
def test_an_untrustworthy_answer_is_unknown_and_the_lookup_settles_it(
    world: World, mode: str, status: int, error: str
) -> None:
    started = world.start_task()
    operation_id = started["operation"]["id"]
    world.desk.set_fault(mode)

    answer = world.execute(started)

    assert answer.status_code == 200, answer.text
    [called] = payloads(operation_id, "connector.called")
    assert (called["outcome"], called["status"], called["error"]) == (
        "unknown",
        status,
        error,
    )
    # The inline recovery looked the key up and found the one ticket.
    assert answer.json()["outcome"] == "verified", answer.json()
    operation = Operation.objects.get(pk=operation_id)
    [ticket] = world.desk.tickets()
    assert (operation.state, operation.attempts) == ("verified", 1)
    assert operation.provider_reference == ticket["ticket_id"]
    effects = world.desk.effects()
    assert (effects["tickets_created"], effects["create_requests"]) == (1, 1)
    # A redirect is never followed: nothing asked for the place it named.
    assert "/tickets/elsewhere" not in world.desk.log_path.read_text()


def test_a_dripped_answer_is_cut_at_the_calls_deadline(world: World) -> None:
    """A byte every 50 ms keeps each read within the 2 s read timeout, so only the
    call's deadline (connect 1 s + read 2 s) ends it: unknown after about 3 s,
    not the 25 s the whole answer would take."""
    started = world.start_task()
    operation_id = started["operation"]["id"]
    world.desk.set_fault("drip", delay_s=0.05)

    answer = world.execute(started)

    [called] = payloads(operation_id, "connector.called")
    assert called["outcome"] == "unknown"
    assert "ReadTimeout" in called["error"], called
    limit_s = world.connector.connect_timeout_s + world.connector.read_timeout_s
    assert called["duration_ms"] <= (limit_s + 1) * 1000, called
    assert answer.json()["outcome"] == "verified", answer.json()
    [ticket] = world.desk.tickets()
    operation = Operation.objects.get(pk=operation_id)
    assert operation.provider_reference == ticket["ticket_id"]
    assert world.desk.effects()["create_requests"] == 1
