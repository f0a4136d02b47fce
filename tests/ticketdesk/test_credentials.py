"""The credential format: mint and verify agree, and anything else is refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest

from ticketdesk import credentials
from ticketdesk.credentials import (
    CredentialExpired,
    CredentialInvalid,
    CredentialScope,
    check_scope,
    mint,
    verify,
)

from .conftest import claims

KEY = "test-signing-key"
NOW = 1_800_000_000.0


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def signed(payload: str, key: str = KEY) -> str:
    """A token built by hand from the README's definition."""
    mac = hmac.new(key.encode(), payload.encode("ascii"), hashlib.sha256).digest()
    return f"{payload}.{b64(mac)}"


def test_minted_token_follows_the_documented_format() -> None:
    token = mint(claims(exp=NOW + 60), KEY)

    payload = token.split(".")[0]
    assert "=" not in token
    assert json.loads(base64.urlsafe_b64decode(payload + "==")) == claims(exp=NOW + 60)
    assert token == signed(payload)


def test_verify_returns_the_claims_of_a_hand_built_token() -> None:
    body = dict(claims(exp=NOW + 60), iat=NOW)  # extra claims are carried along
    token = signed(b64(json.dumps(body).encode()))

    assert verify(token, KEY, NOW) == body


def test_expiry_is_exclusive() -> None:
    assert verify(mint(claims(exp=NOW + 0.5), KEY), KEY, NOW)["exp"] == NOW + 0.5
    with pytest.raises(CredentialExpired):
        verify(mint(claims(exp=NOW), KEY), KEY, NOW)


def _tampered() -> str:
    signature = mint(claims(exp=NOW + 60), KEY).split(".")[1]
    other = b64(json.dumps(claims(exp=NOW + 60, tenant="globex")).encode())
    return f"{other}.{signature}"


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(mint(claims(exp=NOW + 60), "another-key"), id="other-key"),
        pytest.param(_tampered(), id="tampered-claims"),
        pytest.param("", id="empty"),
        pytest.param("abc", id="one-segment"),
        pytest.param("a.b.c", id="three-segments"),
        pytest.param(mint(claims(exp=NOW + 60), KEY) + "=", id="padded"),
        pytest.param(signed(b64(b"not json")), id="not-json"),
        pytest.param(signed(b64(b"[1, 2]")), id="not-an-object"),
        pytest.param(signed(b64(b'{"exp": NaN}')), id="nan-expiry"),
        pytest.param(
            signed(b64(json.dumps({**claims(exp=NOW + 60), "fields": "a"}).encode())),
            id="fields-not-a-list",
        ),
    ],
)
def test_verify_refuses_tokens_that_are_not_genuine_and_complete(token: str) -> None:
    with pytest.raises(CredentialInvalid) as caught:
        verify(token, KEY, NOW)

    assert caught.value.code == "credential_invalid"
    assert caught.value.status == 401


@pytest.mark.parametrize("missing", ["tenant", "object_id", "fields", "exp", "jti"])
def test_mint_refuses_incomplete_claims(missing: str) -> None:
    incomplete = claims()
    del incomplete[missing]

    with pytest.raises(ValueError, match=missing):
        mint(incomplete, KEY)


def test_mint_refuses_an_empty_key() -> None:
    with pytest.raises(ValueError, match="empty"):
        mint(claims(), "")


@pytest.mark.parametrize(
    ("scope", "allowed"),
    [
        ({"actions": ["create_ticket"]}, True),
        ({"actions": ["lookup_tickets"]}, False),
        (
            {
                "actions": ["create_ticket"],
                "object_ref": {"type": "order", "id": "ORD-1"},
            },
            True,
        ),
        (
            {
                "actions": ["create_ticket"],
                "object_ref": {"type": "order", "id": "ORD-2"},
            },
            False,
        ),
        (
            {
                "actions": ["create_ticket"],
                "object_ref": {"type": "quote", "id": "ORD-1"},
            },
            False,
        ),
        ({"actions": ["create_ticket"], "fields": ["priority"]}, True),
        ({"actions": ["create_ticket"], "fields": ["priority", "refund_iban"]}, False),
    ],
)
def test_check_scope(scope: dict[str, Any], allowed: bool) -> None:
    granted = claims()
    if allowed:
        check_scope(granted, **scope)
    else:
        with pytest.raises(CredentialScope) as caught:
            check_scope(granted, **scope)
        assert (caught.value.code, caught.value.status) == ("credential_scope", 403)


def test_action_names_are_the_documented_ones() -> None:
    assert credentials.ACTION_CREATE == "create_ticket"
    assert credentials.ACTION_LOOKUP == "lookup_tickets"
