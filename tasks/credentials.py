"""Short-lived, single-use credentials the gateway sends with each remote call.

A credential is an EdDSA (Ed25519, RFC 8037) JSON Web Token (RFC 7519), signed with
the connector's private key; the remote system holds only the public key and
verifies with a stock JWT library, finding the key by the header's ``kid`` (the
key's RFC 7638 thumbprint). The portal makes each connector's key pair itself
(``key_pair_new``); the private key is stored only sealed (``tasks/sealed.py``,
``connector_key_seal``) and opened here, for the one signature. Registered
claims: ``aud`` (the target), ``iat``, ``exp`` and ``jti`` (the Credential row id,
used once). Private claims bind it to one request: ``tenant``, ``use`` (``execute``
or ``lookup``), ``action``, ``idempotency_key`` (the operation's key),
``object_type``, ``object_id``, ``fields`` (the only field names the call may carry)
and, for ``execute``, ``body_sha256`` (SHA-256 of the exact body bytes sent). A
revocation notice (``use: revoke``) lists ``revokes: [{jti, exp}]``. The portal
stores only the SHA-256 of a token, never the token. docs/gateway.md, "What a
governed target must verify", says what the target checks.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .sealed import connector_key_unseal

if TYPE_CHECKING:
    from .models import Connector

# The one algorithm: a target pins it (never the token's own ``alg``).
ALGORITHM: Final = "EdDSA"
USE_EXECUTE: Final = "execute"
USE_LOOKUP: Final = "lookup"
USE_REVOKE: Final = "revoke"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def key_pair_new() -> tuple[bytes, str]:
    """A fresh Ed25519 pair: (the raw 32-byte private key, to seal at once; the
    public key as base64url, to store in clear)."""
    private = Ed25519PrivateKey.generate()
    raw_private = private.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    raw_public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return raw_private, _b64url(raw_public)


def public_jwk(public_key: str) -> dict[str, str]:
    """The public key as a JWK (RFC 8037) with its ``kid``, for the target's JWKS."""
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": public_key,
        "kid": key_id(public_key),
        "alg": ALGORITHM,
        "use": "sig",
    }


def key_id(public_key: str) -> str:
    """The key's RFC 7638 JWK thumbprint (SHA-256, base64url): the tokens' ``kid``."""
    members = json.dumps(
        {"crv": "Ed25519", "kty": "OKP", "x": public_key}, separators=(",", ":")
    )
    return _b64url(hashlib.sha256(members.encode()).digest())


def public_pem(public_key: str) -> str:
    """The public key as a PEM ``PUBLIC KEY`` block (SubjectPublicKeyInfo)."""
    raw = base64.urlsafe_b64decode(public_key + "=" * (-len(public_key) % 4))
    return (
        Ed25519PublicKey.from_public_bytes(raw)
        .public_bytes(
            serialization.Encoding.PEM,
            serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        .decode()
    )


def credential_mint(*, claims: Mapping[str, Any], connector: Connector) -> str:
    """Sign ``claims`` with the connector's private key, opened from its seal for
    this one signature; the token travels as a Bearer value, ``kid`` in its header.

    Raises:
        ConnectorKeyUnsealable: the sealed key is not this connector's (copied
            from another row), was changed, or the server secret changed.
    """
    raw = connector_key_unseal(
        tenant_id=connector.tenant_id,
        connector_id=connector.pk,
        sealed=connector.sealed_private_key,
    )
    return jwt.encode(
        dict(claims),
        Ed25519PrivateKey.from_private_bytes(raw),
        algorithm=ALGORITHM,
        headers={"kid": connector.key_id},
    )


def credential_fingerprint(token: str) -> str:
    """What the portal keeps of a token: its SHA-256, for matching a leaked one."""
    return hashlib.sha256(token.encode()).hexdigest()


def request_body(payload: Mapping[str, Any]) -> bytes:
    """The exact bytes the gateway sends: one spelling, so a retry sends the same."""
    return json.dumps(
        dict(payload), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


def body_digest(body: bytes) -> str:
    """SHA-256 of the request body bytes, 64 lower-case hex digits (``body_sha256``)."""
    return hashlib.sha256(body).hexdigest()
