"""Short-lived, scoped credentials the gateway sends with each remote call.

Token = ``base64url(JSON claims) "." base64url(HMAC-SHA256(connector key, part 1))``,
unpadded. Claims: ``tenant``, ``object_type``, ``object_id``, ``fields`` (the only
fields the call may carry), ``action``, ``target``, ``exp`` (Unix seconds) and ``jti``
(the Credential row id, so a receiver can report which grant it saw). The remote
system verifies signature, expiry and scope; the portal stores only the SHA-256 of
the token, never the token (docs/gateway.md, "Credentials").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def credential_mint(*, claims: Mapping[str, Any], key: str) -> str:
    """Sign ``claims`` with the connector's key; the token travels as a Bearer value."""
    body = _b64(
        json.dumps(dict(claims), separators=(",", ":"), sort_keys=True).encode()
    )
    signature = hmac.new(key.encode(), body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(signature)}"


def credential_fingerprint(token: str) -> str:
    """What the portal keeps of a token: its SHA-256, for matching a leaked one."""
    return hashlib.sha256(token.encode()).hexdigest()
