"""The gateway's short-lived, single-use credential: an EdDSA JSON Web Token.

The desk holds public keys only, in a JWKS file it is given (``KeyRing``): the
token's ``kid`` picks the key, and a key installed for a tenant verifies that
tenant's tokens only. A stock JWT library verifies the signature (Ed25519, and
only EdDSA whatever the token's header says), ``exp`` and ``aud`` (this desk's
target name); ``check_call`` then checks what binds the
token to one request: use, action, idempotency key, object, field names and the
SHA-256 of the exact body bytes. The desk's replay cache (``store.Desk``) refuses a
``jti`` seen before or revoked. README.md, "The credential", states every claim and
docs/gateway.md, "What a governed target must verify", the rules for a real target.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar, Final

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from jwt.algorithms import OKPAlgorithm

# The one algorithm the desk accepts; never taken from the token.
ALGORITHM: Final = "EdDSA"
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


class KeyRing:
    """The public keys the desk trusts: a JWKS file (RFC 7517), read again whenever
    it changes, so keys installed while the desk runs count from the next request.

    Each key is an Ed25519 ``OKP`` JWK with a ``kid``; a ``tenant`` member, when
    present, binds the key to that tenant's tokens. A missing file is an empty
    ring (every credential refused). Replace the file atomically (write, rename).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._keys: dict[str, tuple[Ed25519PublicKey, str | None]] = {}

    def get(self, kid: str) -> tuple[Ed25519PublicKey, str | None] | None:
        """The public key named ``kid`` and the tenant it is bound to, if any."""
        with self._lock:
            self._reload()
            return self._keys.get(kid)

    def _reload(self) -> None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._keys = None, {}
            return
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        keys: dict[str, tuple[Ed25519PublicKey, str | None]] = {}
        for jwk in json.loads(self.path.read_text(encoding="utf-8"))["keys"]:
            if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                continue  # only Ed25519 public keys: never a shared secret
            if "d" in jwk:
                raise ValueError(f"{self.path}: key {jwk.get('kid')!r} is private")
            key = OKPAlgorithm.from_jwk(jwk)
            assert isinstance(key, Ed25519PublicKey)
            tenant = jwk.get("tenant")
            keys[str(jwk["kid"])] = (key, None if tenant is None else str(tenant))
        self._stamp, self._keys = stamp, keys


def mint(claims: Mapping[str, Any], private_key: Ed25519PrivateKey, *, kid: str) -> str:
    """Sign ``claims`` into an EdDSA JWT (for tests and clients; the desk itself
    holds no private key).

    Raises:
        ValueError: a claim is missing or has the wrong type.
    """
    problems = claims_problems(claims)
    if problems:
        raise ValueError("; ".join(problems))
    return jwt.encode(
        dict(claims), private_key, algorithm=ALGORITHM, headers={"kid": kid}
    )


def verify(token: str, keys: KeyRing, *, audience: str) -> dict[str, Any]:
    """Return the claims of a genuine, unexpired token addressed to ``audience``.

    The header's ``kid`` picks a public key from ``keys``; PyJWT checks the
    signature (EdDSA only: ``alg`` is never taken from the token, so neither
    ``none`` nor an HMAC keyed with the public key passes), ``exp`` and ``iat``
    against the current time with no leeway, and that ``aud`` names this target.
    A key bound to a tenant verifies that tenant's tokens only. A token is expired
    once ``exp <= now``.

    Raises:
        CredentialInvalid: malformed, unknown ``kid``, signed with another key,
            another tenant's key, or claims missing.
        CredentialExpired: genuine but past its ``exp``.
        CredentialScope: genuine but addressed to another target.
    """
    if not token or len(token) > _MAX_TOKEN_LENGTH:
        raise CredentialInvalid("not a JSON Web Token")
    try:
        kid = jwt.get_unverified_header(token).get("kid")
    except jwt.InvalidTokenError as error:
        raise CredentialInvalid(f"{type(error).__name__}: {error}") from None
    try:
        found = keys.get(kid) if isinstance(kid, str) else None
    except (OSError, ValueError, KeyError, TypeError, jwt.PyJWTError) as error:
        raise CredentialInvalid(f"the desk's key file is unusable: {error}") from None
    if found is None:
        raise CredentialInvalid("no trusted key has this kid")
    key, bound_tenant = found
    try:
        claims = jwt.decode(
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
    except jwt.InvalidTokenError as error:
        raise CredentialInvalid(f"{type(error).__name__}: {error}") from None
    problems = claims_problems(claims)
    if problems:
        raise CredentialInvalid("; ".join(problems))
    if bound_tenant is not None and str(claims["tenant"]) != bound_tenant:
        raise CredentialInvalid("the key is another tenant's")
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
