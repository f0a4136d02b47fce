"""The credential format: an HS256 JWT that a stock library verifies; mint and
verify agree, and anything else is refused."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest

from tasks.credentials import credential_mint, request_body
from ticketdesk import credentials
from ticketdesk.credentials import (
    CredentialExpired,
    CredentialInvalid,
    CredentialScope,
    body_digest,
    check_call,
    mint,
    verify,
)

from .conftest import BODY, claims, encoded

KEY = "test-signing-key-of-thirty-two-bytes"


def test_a_minted_token_is_a_standard_hs256_jwt() -> None:
    granted = claims()

    token = mint(granted, KEY)

    assert jwt.get_unverified_header(token) == {"alg": "HS256", "typ": "JWT"}
    decoded = jwt.decode(token, KEY, algorithms=["HS256"], audience="ticket-desk")
    assert decoded == granted


def test_the_portal_mints_what_the_desk_verifies() -> None:
    """tasks.credentials (the portal) and ticketdesk.credentials (the target) agree."""
    body = request_body(BODY)
    granted = claims(body=BODY) | {"body_sha256": body_digest(body)}

    token = credential_mint(claims=granted, key=KEY)

    check_call(
        verify(token, KEY, audience="ticket-desk"),
        use="execute",
        actions=["create_ticket"],
        idempotency_key="op-1",
        object_ref=BODY["object"],
        fields=["priority"],
        body=body,
    )


def test_an_expired_token_is_refused() -> None:
    with pytest.raises(CredentialExpired):
        verify(mint(claims(exp=int(time.time()) - 1), KEY), KEY, audience="ticket-desk")


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(lambda: mint(claims(), KEY + "-other"), id="other-key"),
        pytest.param(lambda: mint(claims(), KEY) + "x", id="signature-changed"),
        pytest.param(
            lambda: jwt.encode(claims(), KEY * 2, algorithm="HS512"), id="other-alg"
        ),
        pytest.param(lambda: jwt.encode(claims(), "", algorithm="none"), id="none"),
        pytest.param(
            lambda: jwt.encode(claims() | {"fields": "a"}, KEY, algorithm="HS256"),
            id="fields-not-a-list",
        ),
        pytest.param(lambda: "", id="empty"),
        pytest.param(lambda: "a.b.c", id="not-base64-json"),
        pytest.param(lambda: "x" * 20_000, id="too-long"),
    ],
)
def test_a_bad_token_is_invalid(token: Any) -> None:
    with pytest.raises(CredentialInvalid):
        verify(token(), KEY, audience="ticket-desk")


def test_a_token_for_another_target_is_out_of_scope() -> None:
    with pytest.raises(CredentialScope):
        verify(mint(claims(aud="crm"), KEY), KEY, audience="ticket-desk")


@pytest.mark.parametrize(
    "missing", ["tenant", "object_id", "fields", "exp", "iat", "jti", "aud", "use"]
)
def test_mint_refuses_incomplete_claims(missing: str) -> None:
    incomplete = claims()
    del incomplete[missing]
    with pytest.raises(ValueError, match=missing):
        mint(incomplete, KEY)


def test_mint_refuses_a_short_key() -> None:
    """RFC 7518 section 3.2: an HS256 key has at least 32 bytes."""
    with pytest.raises(ValueError):
        mint(claims(), "short")


@pytest.mark.parametrize(
    ("scope", "allowed"),
    [
        ({}, True),
        ({"actions": ["lookup_tickets"]}, False),
        ({"use": "lookup"}, False),
        ({"idempotency_key": "op-2"}, False),
        ({"object_ref": {"type": "order", "id": "ORD-2"}}, False),
        ({"object_ref": {"type": "quote", "id": "ORD-1"}}, False),
        ({"fields": ["priority", "refund_iban"]}, False),
        ({"body": encoded(BODY | {"summary": "x"})}, False),
    ],
)
def test_check_call(scope: dict[str, Any], allowed: bool) -> None:
    request: dict[str, Any] = {
        "use": "execute",
        "actions": ["create_ticket"],
        "idempotency_key": "op-1",
        "object_ref": {"type": "order", "id": "ORD-1"},
        "fields": ["priority"],
        "body": encoded(BODY),
    } | scope
    if allowed:
        check_call(claims(), **request)
    else:
        with pytest.raises(CredentialScope) as caught:
            check_call(claims(), **request)
        assert (caught.value.code, caught.value.status) == ("credential_scope", 403)


def test_action_names_are_the_documented_ones() -> None:
    assert credentials.ACTION_CREATE == "create_ticket"
    assert credentials.ACTION_LOOKUP == "lookup_tickets"
