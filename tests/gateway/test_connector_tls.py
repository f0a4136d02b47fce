"""A target whose certificate fails verification never received the call.

The portal refuses the certificate in the TLS handshake, before a byte of the
request is written, so the call is ``not_executed`` (tasks/connectors.py), not
``unknown``: the evidence says nothing reached the target. The recovery protocol
still settles it by the receipt lookup under the same key (docs/gateway.md), with
the real ticket desk serving https on 127.0.0.1 (tests/support/tls.py).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit.models import Event
from tasks import services as task_services
from tasks.connectors import HttpJsonConnector
from tasks.credentials import public_jwk
from tasks.gateway import operation_recover
from tasks.models import Connector, Operation
from tests.gateway.conftest import World
from tests.support.outbound import allow as outbound_allow
from tests.support.tls import make_certificates
from ticketdesk.harness import TicketDesk, start_ticketdesk

pytestmark = pytest.mark.django_db(transaction=True)


def payloads(operation_id: str, code: str) -> list[dict[str, Any]]:
    return list(
        Event.objects.filter(operation_id=operation_id, code=code)
        .order_by("id")
        .values_list("payload", flat=True)
    )


def save(world: World, **values: str) -> Connector:
    return task_services.connector_save(
        tenant=world.tenant, target="ticket-desk", values=values
    )


def serve(world: World, desk: TicketDesk) -> None:
    desk.trust(public_jwk(world.connector.public_key), tenant=str(world.tenant.pk))


def test_a_certificate_that_fails_verification_is_not_executed_and_recovery_settles_it(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    # Given: production, the portal trusting one CA, and the allow-listed desk
    # serving https with a certificate of another CA.
    settings.DEV_MODE = False
    settings.PORTAL_RECOVERY_BACKOFF_S = 0  # the next lookup is due at once
    trusted = make_certificates(tmp_path / "trusted")
    other = make_certificates(tmp_path / "other", label="other")
    monkeypatch.setenv("SSL_CERT_FILE", str(trusted.ca))
    with start_ticketdesk(tls=(other.cert, other.key), ca_file=other.ca) as impostor:
        serve(world, impostor)
        outbound_allow(settings, monkeypatch, impostor.url)
        save(world, base_url=impostor.url)
        # When: the agent executes.
        started = world.start_task()
        answer = world.execute(started)
        # Then: the handshake refused the certificate, so no request reached the
        # desk: the call is recorded as not executed, with the certificate named.
        assert answer.status_code == 200, answer.text
        assert impostor.effects()["requests"] == 0
        assert impostor.tickets() == []
    operation_id = started["operation"]["id"]
    [called] = payloads(operation_id, "connector.called")
    assert called["outcome"] == "not_executed"
    assert "CERTIFICATE_VERIFY_FAILED" in called["error"]
    # And: the operation is in doubt like after a 429; the inline lookup was
    # refused the same way, a "cannot tell"; nothing was settled.
    assert answer.json()["outcome"] == "unknown"
    [looked] = payloads(operation_id, "receipt.queried")
    assert looked["outcome"] == "unknown"
    assert "CERTIFICATE_VERIFY_FAILED" in looked["error"]
    operation = Operation.objects.get(pk=operation_id)
    assert (operation.state, operation.attempts) == ("unknown", 1)

    # Given: the same host:port now serves the trusted CA's certificate.
    port = httpx.URL(impostor.url).port
    with start_ticketdesk(
        port=port, tls=(trusted.cert, trusted.key), ca_file=trusted.ca
    ) as desk:
        serve(world, desk)
        # When: recovery runs (what the settle job does).
        result = operation_recover(tenant=world.tenant, operation_id=operation.pk)
        # Then: the lookup finds no ticket for the key, so the call is made again
        # under the same key, and verified: one ticket.
        assert result.outcome == "verified", result
        [ticket] = desk.tickets()
    assert ticket["idempotency_key"] == started["operation"]["idempotency_key"]
    operation.refresh_from_db()
    assert (operation.state, operation.attempts) == ("verified", 2)
    outcomes = [p["outcome"] for p in payloads(operation_id, "connector.called")]
    assert outcomes == ["not_executed", "succeeded"]


def test_a_refused_connection_stays_unknown(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
):
    """Only a certificate refused in the handshake is known not to have reached the
    target: another connection error keeps the call ``unknown``."""
    # Given: an allow-listed address where nothing listens (a port just freed).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    outbound_allow(settings, monkeypatch, url)
    connector = save(world, base_url=url)
    # When: the connector calls it.
    result = HttpJsonConnector(connector).execute(
        idempotency_key="k-1", credential="not-sent", body=b"{}"
    )
    # Then: a connection error, in doubt.
    assert result.kind == "unknown"
    assert result.error.startswith("ConnectError"), result.error
