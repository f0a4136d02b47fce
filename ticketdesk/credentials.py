"""The gateway's short-lived scoped credential: mint, verify and check its scope.

A token is ``<payload>.<signature>``: ``payload`` is the base64url form of the claims
as UTF-8 JSON, ``signature`` the base64url form of HMAC-SHA256(key, payload's ASCII
bytes). base64url is RFC 4648 section 5 without ``=`` padding. README.md states the
claims. Standard library only: the portal imports ``mint`` from here, and the ticket
desk runs with nothing installed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, Final

ACTION_CREATE: Final = "create_ticket"
ACTION_LOOKUP: Final = "lookup_tickets"
# Claims every token must carry, with the JSON types each may have.
_STRING_CLAIMS: Final = ("object_type", "object_id", "action", "target", "jti")
_SEGMENT: Final = re.compile(r"[A-Za-z0-9_-]+")
# A header holds a few hundred claims at most; larger input is not a credential.
_MAX_TOKEN_LENGTH: Final = 16_384


class CredentialError(Exception):
    """The credential is refused."""

    code: ClassVar[str] = "credential_invalid"
    status: ClassVar[int] = 401

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail or (self.__doc__ or self.code).strip().splitlines()[0])

    @property
    def detail(self) -> str:
        return str(self.args[0])


class CredentialInvalid(CredentialError):
    """The credential is missing, malformed or not signed with the desk's key."""


class CredentialExpired(CredentialError):
    """The credential has expired."""

    code = "credential_expired"


class CredentialScope(CredentialError):
    """The credential does not cover this request."""

    code = "credential_scope"
    status = 403


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _decode(segment: str) -> bytes:
    if not _SEGMENT.fullmatch(segment):
        raise CredentialInvalid("not base64url without padding")
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise CredentialInvalid("not base64url without padding") from None


def _key_bytes(key: str | bytes) -> bytes:
    raw = key.encode("utf-8") if isinstance(key, str) else key
    if not raw:
        raise ValueError("the signing key is empty")
    return raw


def _signature(payload: str, key: str | bytes) -> str:
    digest = hmac.new(_key_bytes(key), payload.encode("ascii"), hashlib.sha256)
    return _encode(digest.digest())


def claims_problems(claims: Mapping[str, Any]) -> list[str]:
    """What is wrong with a claims object: missing claims or wrong types."""
    problems = []
    tenant = claims.get("tenant")
    # bool is an int in Python, but true is no tenant id.
    if isinstance(tenant, bool) or not isinstance(tenant, str | int) or tenant == "":
        problems.append("tenant must be a non-empty string or an integer")
    for name in _STRING_CLAIMS:
        value = claims.get(name)
        if not isinstance(value, str) or not value:
            problems.append(f"{name} must be a non-empty string")
    fields = claims.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        problems.append("fields must be a list of strings")
    exp = claims.get("exp")
    # json.loads reads NaN and Infinity; a NaN expiry would never expire.
    if (
        isinstance(exp, bool)
        or not isinstance(exp, int | float)
        or not math.isfinite(exp)
    ):
        problems.append("exp must be a finite number (unix seconds)")
    return problems


def mint(claims: Mapping[str, Any], key: str | bytes) -> str:
    """Sign ``claims`` into a token the ticket desk accepts until ``exp``.

    Raises:
        ValueError: a claim is missing or has the wrong type, or the key is empty.
    """
    problems = claims_problems(claims)
    if problems:
        raise ValueError("; ".join(problems))
    body = json.dumps(dict(claims), sort_keys=True, separators=(",", ":"))
    payload = _encode(body.encode("utf-8"))
    return f"{payload}.{_signature(payload, key)}"


def verify(token: str, key: str | bytes, now: float) -> dict[str, Any]:
    """Return the claims of a token signed with ``key`` that is unexpired at ``now``.

    The signature is checked before the claims are parsed, in constant time. A
    token is expired once ``exp <= now``.

    Raises:
        CredentialInvalid: malformed, signed with another key, or claims missing.
        CredentialExpired: genuine but past its ``exp``.
    """
    if not token or len(token) > _MAX_TOKEN_LENGTH or token.count(".") != 1:
        raise CredentialInvalid("not a <payload>.<signature> token")
    payload, signature = token.split(".")
    _decode(payload)
    _decode(signature)
    if not hmac.compare_digest(_signature(payload, key), signature):
        raise CredentialInvalid("the signature does not match")
    try:
        claims = json.loads(_decode(payload).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CredentialInvalid("the claims are not JSON") from None
    if not isinstance(claims, dict):
        raise CredentialInvalid("the claims are not a JSON object")
    problems = claims_problems(claims)
    if problems:
        raise CredentialInvalid("; ".join(problems))
    if claims["exp"] <= now:
        raise CredentialExpired()
    return claims


def check_scope(
    claims: Mapping[str, Any],
    *,
    actions: Collection[str],
    object_ref: Mapping[str, Any] | None = None,
    fields: Collection[str] = (),
) -> None:
    """Refuse a request that the verified ``claims`` do not cover.

    Args:
        claims: as returned by ``verify``.
        actions: the actions that may make this request.
        object_ref: the business object the request names (``type``, ``id``), if any.
        fields: the field names the request writes.

    Raises:
        CredentialScope: another action, another object or a field outside the grant.
    """
    if claims["action"] not in actions:
        raise CredentialScope(f"the credential is for {claims['action']!r}")
    if object_ref is not None and (
        object_ref.get("type") != claims["object_type"]
        or object_ref.get("id") != claims["object_id"]
    ):
        raise CredentialScope("the credential is for another object")
    outside = sorted(set(fields) - set(claims["fields"]))
    if outside:
        raise CredentialScope(f"fields outside the credential: {', '.join(outside)}")
