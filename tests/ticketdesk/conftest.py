"""A real ticket desk child process for the module, reset before every test.

The tests speak HTTP to it with ``http.client`` and assert on the desk's own ledger
(``desk.effects()``); they need no database.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from ticketdesk.credentials import mint
from ticketdesk.harness import TicketDesk, start_ticketdesk

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


def claims(**overrides: Any) -> dict[str, Any]:
    """Claims of a credential for creating BODY's ticket, valid for a minute."""
    return {
        "tenant": TENANT,
        "object_type": ORDER["type"],
        "object_id": ORDER["id"],
        "fields": ["priority", "channel"],
        "action": "create_ticket",
        "target": "ticket-desk",
        "exp": int(time.time()) + 60,
        "jti": "jti-1",
    } | overrides


def token(desk: TicketDesk, **overrides: Any) -> str:
    return mint(claims(**overrides), desk.signing_key)


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
    return call(
        desk,
        "POST",
        "/tickets",
        body=BODY if body is None else body,
        bearer=token(desk, **claim_overrides),
        key=key,
    )


def lookup(desk: TicketDesk, query: str, **claim_overrides: Any) -> Reply:
    return call(desk, "GET", f"/tickets?{query}", bearer=token(desk, **claim_overrides))


@pytest.fixture(scope="module")
def running_desk() -> Iterator[TicketDesk]:
    with start_ticketdesk() as desk:
        yield desk


@pytest.fixture
def desk(running_desk: TicketDesk) -> TicketDesk:
    running_desk.reset()
    return running_desk
