"""POST /tickets refuses every credential that does not cover it, and does nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ticketdesk.credentials import mint
from ticketdesk.harness import TicketDesk

from .conftest import BODY, call, claims, token


def _bearer(desk: TicketDesk, case: str) -> str | None:
    if case == "missing":
        return None
    if case == "forged":
        return mint(claims(), "a-key-the-desk-does-not-know")
    if case == "tampered":
        # Another tenant's claims under a genuine signature of the desk's key.
        signature = token(desk).split(".")[1]
        other_claims = mint(claims(tenant="globex"), "x").split(".")[0]
        return f"{other_claims}.{signature}"
    if case == "garbage":
        return "not-a-token"
    overrides: dict[str, dict[str, Any]] = {
        "expired": {"exp": int(time.time()) - 1},
        "wrong-action": {"action": "lookup_tickets"},
        "field-outside-scope": {"fields": ["channel"]},
        "other-object": {"object_id": "ORD-2"},
        "other-object-type": {"object_type": "invoice"},
    }
    return token(desk, **overrides[case])


@pytest.mark.parametrize(
    ("case", "status", "error"),
    [
        ("missing", 401, "credential_invalid"),
        ("forged", 401, "credential_invalid"),
        ("tampered", 401, "credential_invalid"),
        ("garbage", 401, "credential_invalid"),
        ("expired", 401, "credential_expired"),
        ("wrong-action", 403, "credential_scope"),
        ("field-outside-scope", 403, "credential_scope"),
        ("other-object", 403, "credential_scope"),
        ("other-object-type", 403, "credential_scope"),
    ],
)
def test_refused_credential_has_no_side_effect(
    desk: TicketDesk, case: str, status: int, error: str
) -> None:
    reply = call(
        desk, "POST", "/tickets", body=BODY, bearer=_bearer(desk, case), key="op-1"
    )

    assert (reply.status, reply.body["error"]) == (status, error)
    effects = desk.effects()
    assert effects["tickets_created"] == 0
    assert effects["create_requests"] == 1


def test_refused_credential_does_not_claim_the_key(desk: TicketDesk) -> None:
    call(desk, "POST", "/tickets", body=BODY, bearer=token(desk, exp=1), key="op-1")

    retried = call(desk, "POST", "/tickets", body=BODY, bearer=token(desk), key="op-1")

    assert retried.status == 201


def test_basic_scheme_is_refused(desk: TicketDesk) -> None:
    reply = call(
        desk,
        "POST",
        "/tickets",
        body=BODY,
        key="op-1",
        headers={"Authorization": f"Basic {token(desk)}"},
    )

    assert (reply.status, reply.body["error"]) == (401, "credential_invalid")
    assert desk.effects()["tickets_created"] == 0
