"""The gateway's short-lived, single-use credential: an HS256 JSON Web Token.

A stock JWT library verifies it: signature (HMAC-SHA256 with the shared key), ``exp``
and ``aud`` (this desk's target name); ``check_call`` then checks what binds the
token to one request: use, action, idempotency key, object, field names and the
SHA-256 of the exact body bytes. The desk's replay cache (``store.Desk``) refuses a
``jti`` seen before or revoked. README.md, "The credential", states every claim and
docs/gateway.md, "What a governed target must verify", the rules for a real target.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, Final

import jwt

ALGORITHM: Final = "HS256"
# RFC 7518 section 3.2: an HS256 key is at least as long as the hash (32 bytes).
MIN_KEY_BYTES: Final = 32
ACTION_CREATE: Final = "create_ticket"
ACTION_LOOKUP: Final = "lookup_tickets"
# What a token may be used for: one create (with its body digest), one lookup, or one
# revocation notice from the portal.
USE_EXECUTE: Final = "execute"
USE_LOOKUP: Final = "lookup"
USE_REVOKE: Final = "revoke"
USES: Final = (USE_EXECUTE, USE_LOOKUP, USE_REVOKE)
# The registered claims every token carries; PyJWT refuses a token without one.
REQUIRED_CLAIMS: Final = ("exp", "iat", "aud", "jti")
_STRING_CLAIMS: Final = ("jti", "use", "aud")
# Claims of a token for one call (execute or lookup), beside the strings above.
_CALL_STRING_CLAIMS: Final = ("object_type", "object_id", "action", "idempotency_key")
# A header holds a few hundred claims at most; larger input is not a credential.
_MAX_TOKEN_LENGTH: Final = 16_384
# Raises on a short key instead of warning, on minting and on verifying.
_JWT: Final = jwt.PyJWT(options={"enforce_minimum_key_length": True})


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


class CredentialReplayed(CredentialError):
    """This credential was used before; each credential is good for one request."""

    code = "credential_replayed"


class CredentialRevoked(CredentialError):
    """The portal revoked this credential."""

    code = "credential_revoked"


class CredentialScope(CredentialError):
    """The credential does not cover this request."""

    code = "credential_scope"
    status = 403


def body_digest(body: bytes) -> str:
    """SHA-256 of the exact request body bytes, as 64 lower-case hex digits."""
    return hashlib.sha256(body).hexdigest()


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
    for name in ("exp", "iat"):
        value = claims.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{name} must be an integer (unix seconds)")
    use = claims.get("use")
    if use not in USES:
        problems.append(f"use must be one of: {', '.join(USES)}")
    if use == USE_REVOKE:
        revokes = claims.get("revokes")
        if not isinstance(revokes, list) or not all(
            isinstance(item, dict)
            and isinstance(item.get("jti"), str)
            and isinstance(item.get("exp"), int)
            for item in revokes
        ):
            problems.append("revokes must be a list of {jti: string, exp: integer}")
        return problems
    for name in _CALL_STRING_CLAIMS:
        value = claims.get(name)
        if not isinstance(value, str) or not value:
            problems.append(f"{name} must be a non-empty string")
    fields = claims.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        problems.append("fields must be a list of strings")
    if use == USE_EXECUTE and not isinstance(claims.get("body_sha256"), str):
        problems.append("body_sha256 must be a string")
    return problems


def mint(claims: Mapping[str, Any], key: str | bytes) -> str:
    """Sign ``claims`` into an HS256 JWT the ticket desk accepts until ``exp``.

    Raises:
        ValueError: a claim is missing or has the wrong type, or the key is shorter
            than 32 bytes.
    """
    problems = claims_problems(claims)
    if problems:
        raise ValueError("; ".join(problems))
    try:
        return _JWT.encode(dict(claims), key, algorithm=ALGORITHM)
    except jwt.InvalidKeyError as error:
        raise ValueError(str(error)) from None


def verify(token: str, key: str | bytes, *, audience: str) -> dict[str, Any]:
    """Return the claims of a genuine, unexpired token addressed to ``audience``.

    PyJWT checks the signature (HS256 only: ``alg`` is never taken from the token),
    ``exp`` and ``iat`` against the current time with no leeway, and that ``aud``
    names this target. A token is expired once ``exp <= now``.

    Raises:
        CredentialInvalid: malformed, signed with another key, or claims missing.
        CredentialExpired: genuine but past its ``exp``.
        CredentialScope: genuine but addressed to another target.
    """
    if not token or len(token) > _MAX_TOKEN_LENGTH:
        raise CredentialInvalid("not a JSON Web Token")
    try:
        claims = _JWT.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            audience=audience,
            options={"require": list(REQUIRED_CLAIMS), "strict_aud": True},
        )
    except jwt.ExpiredSignatureError:
        raise CredentialExpired() from None
    except jwt.InvalidAudienceError:
        raise CredentialScope("the credential is for another target") from None
    except jwt.InvalidKeyError:
        raise CredentialInvalid("the desk's signing key is too short") from None
    except jwt.InvalidTokenError as error:
        raise CredentialInvalid(f"{type(error).__name__}: {error}") from None
    problems = claims_problems(claims)
    if problems:
        raise CredentialInvalid("; ".join(problems))
    return claims


def check_call(
    claims: Mapping[str, Any],
    *,
    use: str,
    actions: Collection[str],
    idempotency_key: str | None = None,
    object_ref: Mapping[str, Any] | None = None,
    fields: Collection[str] = (),
    body: bytes | None = None,
) -> None:
    """Refuse a request that the verified ``claims`` were not issued for.

    Args:
        claims: as returned by ``verify``.
        use: what the request does (``execute``, ``lookup`` or ``revoke``).
        actions: the actions that may make this request.
        idempotency_key: the request's key; must equal the claim when given.
        object_ref: the business object the request names (``type``, ``id``), if any.
        fields: the field names the request writes.
        body: the exact request body; its SHA-256 must equal ``body_sha256``.

    Raises:
        CredentialScope: another use, action, key, object, field or body.
    """
    if claims["use"] != use:
        raise CredentialScope(f"the credential is for a {claims['use']!r} request")
    if claims["action"] not in actions:
        raise CredentialScope(f"the credential is for {claims['action']!r}")
    if idempotency_key is not None and claims["idempotency_key"] != idempotency_key:
        raise CredentialScope("the credential is for another idempotency key")
    if object_ref is not None and (
        object_ref.get("type") != claims["object_type"]
        or object_ref.get("id") != claims["object_id"]
    ):
        raise CredentialScope("the credential is for another object")
    outside = sorted(set(fields) - set(claims["fields"]))
    if outside:
        raise CredentialScope(f"fields outside the credential: {', '.join(outside)}")
    if body is not None and not hmac.compare_digest(
        body_digest(body), claims["body_sha256"]
    ):
        raise CredentialScope("the body is not the one the credential was issued for")
