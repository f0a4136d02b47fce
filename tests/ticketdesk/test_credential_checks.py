"""POST /tickets refuses every credential that does not cover it, and does nothing.

A credential is good for one request: the one whose key, action, target, object,
field names and exact body it names (issue 10 §2, credential replay).
"""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ticketdesk.credentials import mint
from ticketdesk.harness import TicketDesk

from .conftest import BODY, KEY, KID, call, claims, create, encoded, lookup, sign, token

# A key the desk does not trust, presented under the kid of one it does.
OTHER_KEY = Ed25519PrivateKey.generate()
NO_OBJECT = {name: value for name, value in BODY.items() if name != "object"}


def _request(desk: TicketDesk, case: str) -> tuple[str | None, dict[str, Any], str]:
    """(bearer, body, Idempotency-Key) for one refused case."""
    if case == "missing":
        return None, BODY, "op-1"
    if case == "forged":
        return mint(claims(), OTHER_KEY, kid=KID), BODY, "op-1"
    if case == "tampered":
        # Another tenant's claims under a genuine signature of the desk's key.
        header, _, signature = token(desk).split(".")
        other_claims = mint(claims(tenant="globex"), OTHER_KEY, kid=KID).split(".")[1]
        return f"{header}.{other_claims}.{signature}", BODY, "op-1"
    if case == "garbage":
        return "not-a-token", BODY, "op-1"
    if case == "alg-none":
        return (
            jwt.encode(claims(), "", algorithm="none", headers={"kid": KID}),
            BODY,
            "op-1",
        )
    if case == "no-iat":
        granted = claims()
        del granted["iat"]
        # mint refuses such claims; PyJWT signs them with the trusted key.
        signed = jwt.encode(granted, KEY, algorithm="EdDSA", headers={"kid": KID})
        return signed, BODY, "op-1"
    if case == "new-key-no-object":
        # The attack of issue 10 §2: a captured credential, a new Idempotency-Key,
        # a body without ``object``.
        return token(desk), NO_OBJECT, "op-attacker"
    if case == "no-object":
        return token(desk, body=NO_OBJECT), NO_OBJECT, "op-1"
    if case == "other-body":
        return token(desk), BODY | {"summary": "Refund twice"}, "op-1"
    if case == "other-field-value":
        return token(desk), BODY | {"fields": {"priority": "low"}}, "op-1"
    if case == "other-key":
        return token(desk), BODY, "op-2"
    overrides: dict[str, dict[str, Any]] = {
        "expired": {"exp": int(time.time()) - 1},
        "wrong-action": {"action": "lookup_tickets"},
        "wrong-use": {"use": "lookup"},
        "other-target": {"aud": "crm"},
        "field-outside-scope": {"fields": ["channel"]},
        "other-object": {"object_id": "ORD-2"},
        "other-object-type": {"object_type": "invoice"},
    }
    return token(desk, **overrides[case]), BODY, "op-1"


@pytest.mark.parametrize(
    ("case", "status", "error"),
    [
        ("missing", 401, "credential_invalid"),
        ("forged", 401, "credential_invalid"),
        ("tampered", 401, "credential_invalid"),
        ("garbage", 401, "credential_invalid"),
        ("alg-none", 401, "credential_invalid"),
        ("no-iat", 401, "credential_invalid"),
        ("expired", 401, "credential_expired"),
        ("wrong-action", 403, "credential_scope"),
        ("wrong-use", 403, "credential_scope"),
        ("other-target", 403, "credential_scope"),
        ("field-outside-scope", 403, "credential_scope"),
        ("other-object", 403, "credential_scope"),
        ("other-object-type", 403, "credential_scope"),
        ("new-key-no-object", 403, "credential_scope"),
        ("no-object", 403, "credential_scope"),
        ("other-body", 403, "credential_scope"),
        ("other-field-value", 403, "credential_scope"),
        ("other-key", 403, "credential_scope"),
    ],
)
def test_refused_credential_has_no_side_effect(
    desk: TicketDesk, case: str, status: int, error: str
) -> None:
    bearer, body, key = _request(desk, case)

    reply = call(desk, "POST", "/tickets", body=body, bearer=bearer, key=key)

    assert (reply.status, reply.body["error"]) == (status, error), reply.body
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


# --- single use: the replay cache -----------------------------------------------------


def test_a_credential_makes_one_request_then_is_refused(desk: TicketDesk) -> None:
    bearer = token(desk)

    first = call(desk, "POST", "/tickets", body=BODY, bearer=bearer, key="op-1")
    replayed = call(desk, "POST", "/tickets", body=BODY, bearer=bearer, key="op-1")

    assert first.status == 201
    assert (replayed.status, replayed.body["error"]) == (401, "credential_replayed")
    assert desk.effects()["tickets_created"] == 1


def test_a_used_credential_is_refused_under_a_new_key(desk: TicketDesk) -> None:
    """Even a body it would cover cannot buy a second ticket with a spent token."""
    bearer = token(desk)
    call(desk, "POST", "/tickets", body=BODY, bearer=bearer, key="op-1")

    again = call(desk, "POST", "/tickets", body=BODY, bearer=bearer, key="op-2")

    assert again.status == 403  # bound to op-1: refused before the replay cache
    assert desk.effects()["tickets_created"] == 1


def test_a_fresh_credential_under_the_same_key_replays_the_ticket(
    desk: TicketDesk,
) -> None:
    """Recovery's retry: a new jti, the same key and body, the first ticket back."""
    first = create(desk, "op-1")

    retried = create(desk, "op-1")

    assert (first.status, retried.status) == (201, 200)
    assert retried.body["ticket_id"] == first.body["ticket_id"]
    assert retried.headers["idempotent-replayed"] == "true"
    assert desk.effects()["tickets_created"] == 1


def test_a_lookup_credential_is_single_use_too(desk: TicketDesk) -> None:
    create(desk, "op-1")
    bearer = token(desk, use="lookup")

    first = call(desk, "GET", "/tickets?idempotency_key=op-1", bearer=bearer)
    again = call(desk, "GET", "/tickets?idempotency_key=op-1", bearer=bearer)

    assert first.status == 200 and len(first.body["tickets"]) == 1
    assert (again.status, again.body["error"]) == (401, "credential_replayed")


def test_a_lookup_credential_names_its_key(desk: TicketDesk) -> None:
    create(desk, "op-1")

    reply = lookup(desk, "idempotency_key=op-1", idempotency_key="op-2")

    assert (reply.status, reply.body["error"]) == (403, "credential_scope")


def test_an_execute_credential_cannot_look_up(desk: TicketDesk) -> None:
    reply = call(desk, "GET", "/tickets?idempotency_key=op-1", bearer=token(desk))

    assert (reply.status, reply.body["error"]) == (403, "credential_scope")


# --- revocation notices from the portal ----------------------------------------------


def _notice(desk: TicketDesk, revokes: list[dict[str, Any]], **overrides: Any) -> str:
    granted = claims(use="revoke", revokes=revokes) | overrides
    return sign(granted)


def test_a_revoked_credential_is_refused(desk: TicketDesk) -> None:
    granted = claims()
    bearer = sign(granted)
    notice = _notice(desk, [{"jti": granted["jti"], "exp": granted["exp"]}])

    taken = call(desk, "POST", "/credentials/revocations", bearer=notice)
    reply = call(desk, "POST", "/tickets", body=BODY, bearer=bearer, key="op-1")

    assert (taken.status, taken.body) == (200, {"revoked": 1, "unused": 1})
    assert (reply.status, reply.body["error"]) == (401, "credential_revoked")
    assert desk.effects()["tickets_created"] == 0


@pytest.mark.parametrize(
    ("case", "status", "error"),
    [
        ("forged", 401, "credential_invalid"),
        ("not-a-notice", 403, "credential_scope"),
        ("other-target", 403, "credential_scope"),
        ("replayed", 401, "credential_replayed"),
    ],
)
def test_a_bad_revocation_notice_revokes_nothing(
    desk: TicketDesk, case: str, status: int, error: str
) -> None:
    granted = claims()
    revokes = [{"jti": granted["jti"], "exp": granted["exp"]}]
    if case == "forged":
        notice = mint(claims(use="revoke", revokes=revokes), OTHER_KEY, kid=KID)
    elif case == "not-a-notice":
        notice = token(desk)  # an execute credential cannot revoke
    elif case == "other-target":
        notice = _notice(desk, revokes, aud="crm")
    else:
        # A notice is single-use too: a captured empty one cannot be sent again
        # with the same jti to revoke something else.
        notice = _notice(desk, [])
        first = call(desk, "POST", "/credentials/revocations", bearer=notice)
        assert first.status == 200

    reply = call(desk, "POST", "/credentials/revocations", bearer=notice)

    assert (reply.status, reply.body["error"]) == (status, error)
    created = call(
        desk,
        "POST",
        "/tickets",
        body=BODY,
        bearer=sign(granted),
        key="op-1",
    )
    assert created.status == 201


def test_the_body_digest_is_over_the_exact_bytes(desk: TicketDesk) -> None:
    """The same JSON spelled differently is other bytes: a real target hashes what
    arrived, before parsing it."""
    spaced = encoded(BODY).replace(b", ", b",  ")

    reply = call(desk, "POST", "/tickets", raw=spaced, bearer=token(desk), key="op-1")

    assert (reply.status, reply.body["error"]) == (403, "credential_scope")
