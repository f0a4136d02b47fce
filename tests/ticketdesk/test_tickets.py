"""Tickets: created once per idempotency key, found by key or object, per tenant.

Every assertion about side effects reads the desk's own ledger, never ours.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ticketdesk.harness import TicketDesk

from .conftest import BODY, call, create, lookup, token


def test_create_answers_201_then_replays_the_same_ticket_with_200(
    desk: TicketDesk,
) -> None:
    first = create(desk, "op-1")
    again = create(desk, "op-1")

    assert first.status == 201
    assert first.body["ticket_id"] == "TCK-000001"
    assert first.body["receipt"]["ticket_id"] == "TCK-000001"
    assert first.body["receipt"]["credential_jti"].startswith("jti-")
    assert {name: first.body[name] for name in BODY} == BODY
    assert (again.status, again.body) == (200, first.body)
    assert again.headers["idempotent-replayed"] == "true"
    effects = desk.effects()
    assert effects["tickets_created"] == 1
    assert effects["by_idempotency_key"] == {"op-1": 1}


def test_member_order_does_not_make_another_body(desk: TicketDesk) -> None:
    create(desk, "op-1")

    reordered = create(desk, "op-1", body=dict(reversed(list(BODY.items()))))

    assert reordered.status == 200
    assert desk.effects()["tickets_created"] == 1


def test_key_reused_with_another_body_is_refused_without_effect(
    desk: TicketDesk,
) -> None:
    create(desk, "op-1")

    reused = create(desk, "op-1", body=BODY | {"summary": "Something else"})

    assert reused.status == 422
    assert reused.body["error"] == "idempotency_key_reused"
    assert desk.effects()["tickets_created"] == 1
    assert [t["summary"] for t in desk.tickets()] == [BODY["summary"]]


def test_same_key_in_another_tenant_is_another_ticket(desk: TicketDesk) -> None:
    ours = create(desk, "op-1")
    theirs = create(desk, "op-1", tenant="globex")

    assert (ours.status, theirs.status) == (201, 201)
    assert ours.body["ticket_id"] != theirs.body["ticket_id"]
    assert desk.effects()["by_idempotency_key"] == {"op-1": 2}


def test_ticket_ids_are_sequential(desk: TicketDesk) -> None:
    ids = [create(desk, f"op-{n}").body["ticket_id"] for n in range(3)]

    assert ids == ["TCK-000001", "TCK-000002", "TCK-000003"]


def test_concurrent_creates_with_one_key_make_one_ticket(desk: TicketDesk) -> None:
    barrier = threading.Barrier(8, timeout=10)
    statuses: list[int] = []

    def send() -> None:
        barrier.wait()
        statuses.append(create(desk, "op-race").status)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    assert sorted(statuses) == [200] * 7 + [201]
    assert desk.effects()["tickets_created"] == 1


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (None, "idempotency_key_missing"),
        ("", "idempotency_key_invalid"),
        ("k" * 201, "idempotency_key_invalid"),
    ],
    ids=["missing", "empty", "too-long"],
)
def test_create_needs_a_sane_idempotency_key(
    desk: TicketDesk, key: str | None, error: str
) -> None:
    reply = call(desk, "POST", "/tickets", body=BODY, bearer=token(desk), key=key)

    assert (reply.status, reply.body["error"]) == (400, error)
    assert desk.effects()["tickets_created"] == 0


def test_a_key_of_200_characters_is_accepted(desk: TicketDesk) -> None:
    assert create(desk, "k" * 200).status == 201


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"queue": "refunds"}',
        b'{"queue": "refunds", "summary": "s", "priority": "high"}',
        b'{"queue": "refunds", "summary": "s", "object": {"type": "order"}}',
        b'{"queue": "refunds", "summary": "s", "fields": ["priority"]}',
        b'{"queue": 7, "summary": "s"}',
    ],
    ids=[
        "not-json", "not-object", "no-summary", "unknown-member",
        "object-without-id", "fields-not-object", "queue-not-string",
    ],
)  # fmt: skip
def test_malformed_body_is_refused_without_effect(desk: TicketDesk, raw: bytes) -> None:
    reply = call(desk, "POST", "/tickets", raw=raw, bearer=token(desk), key="op-1")

    assert (reply.status, reply.body["error"]) == (400, "invalid_request")
    assert desk.effects()["tickets_created"] == 0


def test_body_without_fields_is_enough(desk: TicketDesk) -> None:
    body = {"queue": "refunds", "summary": "Call back", "object": BODY["object"]}

    reply = create(desk, "op-1", body=body)

    assert reply.status == 201
    assert (reply.body["object"], reply.body["fields"]) == (BODY["object"], {})


def test_a_body_without_the_credentials_object_is_refused(desk: TicketDesk) -> None:
    """The credential names one object; a body that names none is not its request."""
    reply = create(desk, "op-1", body={"queue": "refunds", "summary": "Call back"})

    assert (reply.status, reply.body["error"]) == (403, "credential_scope")
    assert desk.effects()["tickets_created"] == 0


def test_lookup_by_idempotency_key(desk: TicketDesk) -> None:
    created = create(desk, "op-1").body
    create(desk, "op-2")

    found = lookup(desk, "idempotency_key=op-1")
    missing = lookup(desk, "idempotency_key=op-3")

    assert (found.status, found.body) == (200, {"tickets": [created]})
    assert (missing.status, missing.body) == (200, {"tickets": []})


def test_lookup_by_object(desk: TicketDesk) -> None:
    first = create(desk, "op-1").body
    second = create(desk, "op-2", body=BODY | {"summary": "Second try"}).body
    create(desk, "op-3", body={"queue": "refunds", "summary": "No object"})

    found = lookup(desk, "object_type=order&object_id=ORD-1")

    assert found.body == {"tickets": [first, second]}


def test_lookup_by_key_and_object_matches_both(desk: TicketDesk) -> None:
    created = create(desk, "op-1").body

    both = lookup(desk, "idempotency_key=op-1&object_type=order&object_id=ORD-1")

    assert both.body == {"tickets": [created]}


@pytest.mark.parametrize(
    "query", ["", "object_type=order", "object_id=ORD-1", "queue=refunds"]
)
def test_lookup_without_a_criterion_is_refused(desk: TicketDesk, query: str) -> None:
    reply = lookup(desk, query)

    assert (reply.status, reply.body["error"]) == (400, "invalid_request")


def test_lookup_sees_only_the_credential_tenant(desk: TicketDesk) -> None:
    create(desk, "op-1")

    theirs = lookup(desk, "idempotency_key=op-1", tenant="globex")

    assert theirs.body == {"tickets": []}


def test_lookup_of_another_object_is_refused(desk: TicketDesk) -> None:
    create(desk, "op-1")

    other = lookup(desk, "object_type=order&object_id=ORD-2")

    assert (other.status, other.body["error"]) == (403, "credential_scope")


@pytest.mark.parametrize(
    ("overrides", "status"),
    [
        ({"action": "create_ticket"}, 200),
        ({"action": "lookup_tickets"}, 200),
        ({"action": "close_ticket"}, 403),
        ({"exp": 1}, 401),
    ],
    ids=["create-credential", "lookup-credential", "other-action", "expired"],
)
def test_lookup_needs_a_lookup_or_create_credential(
    desk: TicketDesk, overrides: dict[str, Any], status: int
) -> None:
    assert lookup(desk, "idempotency_key=op-1", **overrides).status == status


def test_lookup_without_credential_is_refused(desk: TicketDesk) -> None:
    reply = call(desk, "GET", "/tickets?idempotency_key=op-1")

    assert (reply.status, reply.body["error"]) == (401, "credential_invalid")
    assert reply.headers["www-authenticate"] == "Bearer"


def test_get_ticket_by_id_for_its_tenant_only(desk: TicketDesk) -> None:
    created = create(desk, "op-1").body
    path = f"/tickets/{created['ticket_id']}"

    ours = call(desk, "GET", path, bearer=token(desk, use="lookup"))
    theirs = call(desk, "GET", path, bearer=token(desk, use="lookup", tenant="globex"))
    unknown = call(desk, "GET", "/tickets/TCK-999999", bearer=token(desk, use="lookup"))

    assert (ours.status, ours.body) == (200, created)
    assert (theirs.status, theirs.body["error"]) == (404, "not_found")
    assert unknown.status == 404


def test_requests_are_counted_apart_from_effects(desk: TicketDesk) -> None:
    create(desk, "op-1")
    create(desk, "op-1")
    lookup(desk, "idempotency_key=op-1")

    effects = desk.effects()

    assert effects["requests"] == 3
    assert (effects["create_requests"], effects["lookup_requests"]) == (2, 1)
    assert effects["tickets_created"] == 1


def test_reset_forgets_tickets_counts_and_faults(desk: TicketDesk) -> None:
    create(desk, "op-1")
    desk.set_fault("reject")

    desk.reset()

    assert desk.effects() == {
        "tickets_created": 0,
        "by_idempotency_key": {},
        "requests": 0,
        "create_requests": 0,
        "lookup_requests": 0,
    }
    assert desk.tickets() == []
    assert create(desk, "op-1").body["ticket_id"] == "TCK-000001"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nowhere", 404),
        ("PUT", "/tickets", 405),
        ("DELETE", "/tickets/TCK-000001", 405),
        ("GET", "/_control/reset", 405),
    ],
)
def test_unknown_routes_and_methods(
    desk: TicketDesk, method: str, path: str, status: int
) -> None:
    reply = call(desk, method, path)

    assert reply.status == status
    assert set(reply.body) == {"error", "detail"}
