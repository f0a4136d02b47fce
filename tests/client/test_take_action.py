"""``PortalClient.take_action`` against a live portal seeded by ``seed_demo`` and a
real ticket desk: typed answers, and one ticket however many clients ask at once."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest

from portal import services as portal_services
from portal_client import (
    ActionNotGranted,
    ActionResult,
    FieldRead,
    IdempotencyKeyReused,
    PortalClient,
)
from tasks.models import Task
from tests.support.concurrency import run_in_threads
from ticketdesk.harness import TicketDesk

from .conftest import Demo

CLIENTS = 8


def take(
    client: PortalClient, n: int = 1, *, age: dt.timedelta = dt.timedelta(0), **kw: Any
) -> ActionResult:
    now = dt.datetime.now(dt.UTC)
    client.record_object_version("customer_issue", str(n), version="7")
    arguments = kw.pop("arguments", {"queue": "support_queue_a", "summary": f"#{n}"})
    return client.take_action(
        action="create_ticket",
        target="ticket-desk",
        object_type="customer_issue",
        object_id=str(n),
        object_version="7",
        fields={
            "email": FieldRead(value="a@example.com", source="crm", read_at=now - age),
            "plan": FieldRead(value="pro", source="billing", read_at=now),
        },
        arguments=arguments,
        idempotency_key=f"ticket-for-issue-{n}",
        **kw,
    )


def test_take_action_answers_verified_with_the_receipt(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    with PortalClient(portal_url, demo.secret) as client:
        answer = take(client)
        again = take(client)
    assert (answer.status, answer.created, answer.settled) == ("verified", True, True)
    assert answer.provider_reference == desk.tickets()[0]["ticket_id"]
    assert again.operation_id == answer.operation_id
    assert (again.status, again.created) == ("verified", False)
    assert desk.effects()["create_requests"] == 1


def test_take_action_returns_a_refusal_as_a_typed_answer(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    with PortalClient(portal_url, demo.secret) as client:
        answer = take(client, age=dt.timedelta(minutes=10))
        with pytest.raises(IdempotencyKeyReused):
            take(client, arguments={"queue": "other", "summary": "#1"})
    assert (answer.status, answer.reason_code) == ("refused", "FIELD_STALE")
    assert answer.failed_fields == ("email",)
    assert answer.desk_item_id is not None
    assert "do not retry with a new key" in answer.next_step.lower()
    assert desk.effects()["create_requests"] == 0


def test_take_action_without_a_grant_raises(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    agent = portal_services.agent_create(tenant=demo.tenant, name="no-grants")
    secret = portal_services.agent_key_issue(agent=agent).secret
    with PortalClient(portal_url, secret) as client, pytest.raises(ActionNotGranted):
        take(client)
    assert not Task.objects.filter(tenant=demo.tenant).exists()


def test_eight_clients_with_one_key_at_once_make_one_ticket(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    # Given: eight agents' clients (own connections), lined up on a barrier.
    barrier = threading.Barrier(CLIENTS, timeout=10)

    def one() -> ActionResult:
        with PortalClient(
            portal_url, demo.secret, max_retries=20, backoff_s=0.05, max_backoff_s=1
        ) as client:
            client.record_object_version("customer_issue", "1", version="7")
            barrier.wait()
            return take(client)

    # When: each takes the same action under the same key.
    answers = run_in_threads(*[one] * CLIENTS)

    # Then: one ticket; every answer is the same verified operation and receipt.
    assert not [a for a in answers if isinstance(a, BaseException)], answers
    assert {(a.status, a.operation_id, a.provider_reference) for a in answers} == {
        ("verified", answers[0].operation_id, desk.tickets()[0]["ticket_id"])
    }
    assert sum(a.created for a in answers) == 1
    assert desk.effects()["tickets_created"] == 1
    assert desk.effects()["create_requests"] == 1
    assert Task.objects.filter(tenant=demo.tenant).count() == 1
