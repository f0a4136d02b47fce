"""A connector's signing key is out of the app role's reach (issue 19 §1).

Whatever ``portal_app`` SELECTs from ``tasks_connector``, no value mints a credential
the target accepts: every column is tried as an HS256 secret and as an Ed25519
private key against a real ticket desk on 127.0.0.1, which refuses each, while the
portal's own credential passes. A sealed key copied onto another row does not open,
and the database refuses a clear key where the sealed one belongs.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection

from portal import db_roles
from portal.models import Tenant
from tasks.credentials import credential_mint
from tasks.exceptions import ConnectorKeyUnsealable
from tasks.models import Connector
from tests.support.connectors import desk_connector
from ticketdesk.credentials import mint
from ticketdesk.harness import TicketDesk

from .conftest import execute, refused_by

pytestmark = pytest.mark.django_db


@pytest.fixture
def connector(tenant: Tenant, desk: TicketDesk) -> Connector:
    """A connector to the session's desk (tests/support/desk.py), in the allow-list."""
    return desk_connector(tenant=tenant, desk=desk)


def _lookup_claims(connector: Connector) -> dict[str, Any]:
    now = int(time.time())
    return {
        "aud": connector.target,
        "iat": now,
        "exp": now + 60,
        "jti": str(uuid.uuid4()),
        "tenant": str(connector.tenant_id),
        "use": "lookup",
        "action": "create_ticket",
        "idempotency_key": "k-1",
        "object_type": "customer_issue",
        "object_id": "1",
        "fields": [],
    }


def _desk_answer(desk: TicketDesk, token: str) -> int:
    reply = httpx.get(
        f"{desk.url}/tickets",
        params={"idempotency_key": "k-1"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    return reply.status_code


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _hs256(claims: dict[str, Any], secret: bytes, kid: str) -> str:
    """An HS256 token by hand (PyJWT will not key an HMAC with a public key)."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    payload = _b64url(json.dumps(claims).encode())
    mac = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64url(mac)}"


def _decodings(text: str) -> list[bytes]:
    """The bytes a column value could spell: itself, base64, base64url, hex, and
    the base64 after a ``v1:`` prefix."""
    found = [text.encode()]
    for candidate in (text, text.partition(":")[2]):
        padded = candidate + "=" * (-len(candidate) % 4)
        for decode, text_in in (
            (base64.b64decode, padded),
            (base64.urlsafe_b64decode, padded),
            (bytes.fromhex, candidate),
        ):
            with contextlib.suppress(binascii.Error, ValueError):
                found.append(decode(text_in))
    return [raw for raw in found if raw]


def _private_keys(raw: bytes) -> list[Ed25519PrivateKey]:
    """Every Ed25519 private key ``raw`` could hold: any 32-byte window, or PEM/DER."""
    keys = [
        Ed25519PrivateKey.from_private_bytes(raw[i : i + 32])
        for i in range(max(0, len(raw) - 31))
    ]
    for load in (
        serialization.load_pem_private_key,
        serialization.load_der_private_key,
    ):
        try:
            key = load(raw, password=None)
        except (ValueError, TypeError):
            continue
        if isinstance(key, Ed25519PrivateKey):
            keys.append(key)
    return keys


def test_no_column_the_app_role_reads_mints_a_credential_the_desk_accepts(
    connector: Connector, desk: TicketDesk
) -> None:
    # Given: the portal's own credential is accepted (the desk and key are live).
    genuine = credential_mint(claims=_lookup_claims(connector), connector=connector)
    assert _desk_answer(desk, genuine) == 200
    # When: the app role reads every column of the connector's row ...
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        assert cursor.fetchone()[0] == db_roles.APP_ROLE
        cursor.execute("SELECT * FROM tasks_connector WHERE id = %s", [connector.pk])
        names = [column.name for column in cursor.description]
        row = cursor.fetchone()
    assert "signing_key" not in names
    # ... and tries each value, every way it could be spelled, as a key.
    tried, accepted = 0, []
    for name, value in zip(names, row, strict=True):
        if value is None:
            continue
        for raw in _decodings(str(value)):
            tokens = [_hs256(_lookup_claims(connector), raw, connector.key_id)]
            tokens += [
                mint(_lookup_claims(connector), key, kid=connector.key_id)
                for key in _private_keys(raw)
            ]
            for token in tokens:
                tried += 1
                if _desk_answer(desk, token) != 401:
                    accepted.append(name)
    # Then: the desk refused them all.
    assert tried > 100
    assert accepted == []


def test_a_sealed_key_copied_onto_another_connector_does_not_open(
    connector: Connector, tenant: Tenant, desk: TicketDesk
) -> None:
    other = desk_connector(tenant=tenant, desk=desk, target="crm")
    # The app role may write the column (the admin's services do), so a copy
    # goes in; it is bound to its own connector and opens nowhere else.
    execute(
        "UPDATE tasks_connector SET sealed_private_key = "
        "(SELECT sealed_private_key FROM tasks_connector WHERE id = %s) "
        "WHERE id = %s",
        [connector.pk, other.pk],
    )
    other.refresh_from_db()
    assert other.sealed_private_key == connector.sealed_private_key
    with pytest.raises(ConnectorKeyUnsealable):
        credential_mint(claims=_lookup_claims(other), connector=other)


def _clear_spellings(connector: Connector) -> list[str]:
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return [
        raw.hex(),
        base64.b64encode(raw).decode(),
        _b64url(raw),
        pem,
        "ticketdesk-demo-signing-key-development-only",
        "v1:" + base64.b64encode(raw).decode(),
    ]


@pytest.mark.parametrize("spelling", range(6))
def test_the_database_refuses_a_clear_key_in_the_sealed_column(
    connector: Connector, spelling: int
) -> None:
    value = _clear_spellings(connector)[spelling]
    with refused_by("tasks_connector_sealed_private_key_check"):
        execute(
            "UPDATE tasks_connector SET sealed_private_key = %s WHERE id = %s",
            [value, connector.pk],
        )


def test_the_database_refuses_anything_but_a_raw_public_key(
    connector: Connector,
) -> None:
    """Standard base64 (a 32-byte key padded), or text, is no base64url key."""
    for column, value in (
        ("public_key", "A" * 42 + "="),
        ("key_id", "a shared secret, not a thumbprint"),
    ):
        with refused_by("tasks_connector_public_key_check"):
            execute(
                f"UPDATE tasks_connector SET {column} = %s WHERE id = %s",
                [value, connector.pk],
            )
