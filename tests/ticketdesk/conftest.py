"""A real ticket desk child process for the module, reset before every test.

The tests speak HTTP to it with ``http.client`` and assert on the desk's own ledger
(``desk.effects()``); they need no database.
"""

from __future__ import annotations

import http.client
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

from ticketdesk.credentials import body_digest, mint
from ticketdesk.harness import TicketDesk, start_ticketdesk

# The key pair of the "portal" these tests play: the desk is given the public half.
KEY = Ed25519PrivateKey.generate()
KID = "tests-ticketdesk-key"
TENANT = "acme"
ORDER = {"type": "order", "id": "ORD-1"}
BODY: dict[str, Any] = {
    "queue": "refunds",
    "summary": "Refund order ORD-1",
    "customer": "CUS-9",
    "object": ORDER,
    "fields": {"priority": "high"},
}


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: Any


def encoded(body: Any) -> bytes:
    """The bytes ``call`` sends for a JSON ``body``."""
    return json.dumps(body).encode("utf-8")


def claims(
    *, key: str = "op-1", body: Any = BODY, use: str = "execute", **overrides: Any
) -> dict[str, Any]:
    """Claims of a single-use credential (a fresh ``jti``) for one request, valid
    for a minute: by default the create of BODY under ``op-1``."""
    now = int(time.time())
    granted: dict[str, Any] = {
        "aud": "ticket-desk",
        "iat": now,
        "exp": now + 60,
        "jti": f"jti-{uuid.uuid4()}",
        "tenant": TENANT,
        "use": use,
        "action": "create_ticket",
        "idempotency_key": key,
        "object_type": ORDER["type"],
        "object_id": ORDER["id"],
        "fields": ["priority", "channel"],
    }
    if use == "execute":
        granted["body_sha256"] = body_digest(encoded(body))
    return granted | overrides


def public_jwk(key: Ed25519PrivateKey = KEY, kid: str = KID) -> dict[str, Any]:
    return {**OKPAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": kid}


def sign(granted: dict[str, Any]) -> str:
    """``granted`` signed with the key the desk trusts."""
    return mint(granted, KEY, kid=KID)


def token(desk: TicketDesk, **overrides: Any) -> str:
    return sign(claims(**overrides))


def call(
    desk: TicketDesk,
    method: str,
    path: str,
    *,
    body: Any = None,
    raw: bytes | None = None,
    bearer: str | None = None,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> Reply:
    """One request on its own connection; connection errors propagate."""
    parts = urlsplit(desk.url)
    assert parts.hostname is not None
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = dict(headers or {})
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    if key is not None:
        headers["Idempotency-Key"] = key
    if body is not None:
        raw = json.dumps(body).encode("utf-8")
    if raw is not None:
        headers["Content-Type"] = "application/json"
    try:
        connection.request(method, path, body=raw, headers=headers)
        response = connection.getresponse()
        data = response.read()
        return Reply(
            status=response.status,
            headers={name.lower(): value for name, value in response.getheaders()},
            body=json.loads(data) if data else None,
        )
    finally:
        connection.close()


def create(
    desk: TicketDesk, key: str, body: Any = None, **claim_overrides: Any
) -> Reply:
    """POST /tickets as the gateway does: BODY unless told, a fresh credential."""
    body = BODY if body is None else body
    return call(
        desk,
        "POST",
        "/tickets",
        body=body,
        bearer=token(desk, key=key, body=body, **claim_overrides),
        key=key,
    )


def lookup(desk: TicketDesk, query: str, **claim_overrides: Any) -> Reply:
    """GET /tickets?query with a fresh lookup credential for the query's key."""
    key = parse_qs(query).get("idempotency_key", ["op-1"])[-1]
    bearer = token(desk, use="lookup", key=key, **claim_overrides)
    return call(desk, "GET", f"/tickets?{query}", bearer=bearer)


@pytest.fixture(scope="module")
def running_desk() -> Iterator[TicketDesk]:
    with start_ticketdesk() as desk:
        desk.trust(public_jwk())  # bound to no tenant: these tests play several
        yield desk


@pytest.fixture
def desk(running_desk: TicketDesk) -> TicketDesk:
    running_desk.reset()
    return running_desk
