"""Short-lived, single-use credentials the gateway sends with each remote call.

A credential is an HS256 JSON Web Token (RFC 7519), signed with the connector's
shared key, so the remote system verifies it with a stock JWT library. Registered
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

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

import jwt

ALGORITHM: Final = "HS256"
# RFC 7518 section 3.2: an HS256 key is at least as long as the hash output.
MIN_KEY_BYTES: Final = 32
USE_EXECUTE: Final = "execute"
USE_LOOKUP: Final = "lookup"
USE_REVOKE: Final = "revoke"
# A short key raises (InvalidKeyError) instead of PyJWT's warning.
_JWT: Final = jwt.PyJWT(options={"enforce_minimum_key_length": True})


def credential_mint(*, claims: Mapping[str, Any], key: str) -> str:
    """Sign ``claims`` with the connector's key; the token travels as a Bearer value.

    Raises:
        jwt.InvalidKeyError: the key is shorter than ``MIN_KEY_BYTES``.
    """
    return _JWT.encode(dict(claims), key, algorithm=ALGORITHM)


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
