"""The credential format: an EdDSA (Ed25519) JWT that a stock library verifies with
the public key alone; mint and verify agree, and anything else is refused, the
classic algorithm confusions included."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from tasks.credentials import key_id, key_pair_new, public_jwk, public_pem
from ticketdesk import credentials
from ticketdesk.credentials import (
    CredentialExpired,
    CredentialInvalid,
    CredentialScope,
    KeyRing,
    check_call,
    mint,
    verify,
)
from ticketdesk.harness import write_jwks

from .conftest import BODY, KEY, KID, claims, encoded
from .conftest import public_jwk as desk_jwk


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    path = tmp_path / "keys.json"
    write_jwks(path, desk_jwk())
    return KeyRing(path)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _hs256(granted: dict[str, Any], secret: bytes, kid: str = KID) -> str:
    """An HS256 token made by hand: PyJWT refuses to use a public key as an HMAC
    secret, an attacker's code need not."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    payload = _b64(json.dumps(granted).encode())
    signature = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256)
    return f"{header}.{payload}.{_b64(signature.digest())}"


def test_a_minted_token_is_a_standard_eddsa_jwt_verified_with_the_public_key() -> None:
    granted = claims()

    token = mint(granted, KEY, kid=KID)

    assert jwt.get_unverified_header(token) == {
        "alg": "EdDSA",
        "typ": "JWT",
        "kid": KID,
    }
    decoded = jwt.decode(
        token, KEY.public_key(), algorithms=["EdDSA"], audience="ticket-desk"
    )
    assert decoded == granted


def test_the_portals_key_helpers_describe_one_key() -> None:
    """tasks.credentials: the JWK, the PEM and the kid (RFC 7638) of one key."""
    raw_private, public = key_pair_new()
    private = Ed25519PrivateKey.from_private_bytes(raw_private)
    jwk = public_jwk(public)
    assert jwk["kid"] == key_id(public)
    pem_key = serialization.load_pem_public_key(public_pem(public).encode())
    assert isinstance(pem_key, Ed25519PublicKey)
    token = jwt.encode(claims(), private, algorithm="EdDSA")
    for key in (pem_key, jwt.PyJWK(jwk).key):
        jwt.decode(token, key, algorithms=["EdDSA"], audience="ticket-desk")
    # RFC 7638 section 3.1's construction, by hand.
    members = f'{{"crv":"Ed25519","kty":"OKP","x":"{public}"}}'.encode()
    assert key_id(public) == _b64(hashlib.sha256(members).digest())


def test_an_expired_token_is_refused(ring: KeyRing) -> None:
    with pytest.raises(CredentialExpired):
        verify(
            mint(claims(exp=int(time.time()) - 1), KEY, kid=KID),
            ring,
            audience="ticket-desk",
        )


def _public_key_spellings() -> list[bytes]:
    public = KEY.public_key()
    raw = public.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return [raw, pem, _b64(raw).encode(), json.dumps(desk_jwk()).encode()]


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(
            lambda: mint(claims(), Ed25519PrivateKey.generate(), kid=KID),
            id="other-key-same-kid",
        ),
        pytest.param(
            lambda: mint(claims(), Ed25519PrivateKey.generate(), kid="unknown"),
            id="unknown-kid",
        ),
        pytest.param(lambda: mint(claims(), KEY, kid=KID) + "x", id="sig-changed"),
        pytest.param(lambda: mint(claims(), KEY, kid="unknown"), id="kid-changed"),
        pytest.param(lambda: jwt.encode(claims(), KEY, algorithm="EdDSA"), id="no-kid"),
        pytest.param(
            lambda: jwt.encode(claims(), "", algorithm="none", headers={"kid": KID}),
            id="alg-none",
        ),
        *[
            pytest.param(
                lambda spelling=spelling: _hs256(claims(), spelling),
                id=f"hs256-keyed-with-the-public-key-{n}",
            )
            for n, spelling in enumerate(_public_key_spellings())
        ],
        pytest.param(
            lambda: jwt.encode(
                claims() | {"fields": "a"}, KEY, algorithm="EdDSA", headers={"kid": KID}
            ),
            id="fields-not-a-list",
        ),
        pytest.param(lambda: "", id="empty"),
        pytest.param(lambda: "a.b.c", id="not-base64-json"),
        pytest.param(lambda: "x" * 20_000, id="too-long"),
    ],
)
def test_a_bad_token_is_invalid(token: Any, ring: KeyRing) -> None:
    with pytest.raises(CredentialInvalid):
        verify(token(), ring, audience="ticket-desk")


def test_a_key_bound_to_a_tenant_verifies_that_tenants_tokens_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys.json"
    write_jwks(path, desk_jwk(), tenant="acme")
    ring = KeyRing(path)
    assert verify(mint(claims(), KEY, kid=KID), ring, audience="ticket-desk")
    with pytest.raises(CredentialInvalid, match="another tenant"):
        verify(
            mint(claims(tenant="globex"), KEY, kid=KID), ring, audience="ticket-desk"
        )


def test_a_key_installed_while_running_counts_and_a_private_one_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys.json"
    ring = KeyRing(path)
    token = mint(claims(), KEY, kid=KID)
    with pytest.raises(CredentialInvalid):
        verify(token, ring, audience="ticket-desk")  # no file yet: trusts nothing
    write_jwks(path, desk_jwk())
    assert verify(token, ring, audience="ticket-desk")["jti"]
    private = jwt.algorithms.OKPAlgorithm.to_jwk(KEY, as_dict=True)
    with pytest.raises(ValueError, match="public keys only"):
        write_jwks(path, {**private, "kid": "p"})


def test_a_token_for_another_target_is_out_of_scope(ring: KeyRing) -> None:
    with pytest.raises(CredentialScope):
        verify(mint(claims(aud="crm"), KEY, kid=KID), ring, audience="ticket-desk")


@pytest.mark.parametrize(
    "missing", ["tenant", "object_id", "fields", "exp", "iat", "jti", "aud", "use"]
)
def test_mint_refuses_incomplete_claims(missing: str) -> None:
    incomplete = claims()
    del incomplete[missing]
    with pytest.raises(ValueError, match=missing):
        mint(incomplete, KEY, kid=KID)


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
