"""The ticket desk over https: ``--tls-cert``/``--tls-key``, the harness trusting a
test CA, and one client's failed handshake leaving the desk serving the others."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.tls import CertFiles, make_certificates
from ticketdesk.harness import TicketDesk, start_ticketdesk

from .conftest import BODY, encoded, public_jwk, sign
from .conftest import claims as make_claims

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_desk(certs: CertFiles) -> Iterator[TicketDesk]:
    with start_ticketdesk(tls=(certs.cert, certs.key), ca_file=certs.ca) as desk:
        desk.trust(public_jwk())
        yield desk


def _log_once(desk: TicketDesk, ready: Callable[[str], bool]) -> str:
    """The desk's log once ``ready`` holds for it (each connection's thread writes
    its own line, perhaps after the client has moved on); fails after 5 s."""
    deadline = time.monotonic() + 5
    while not ready(text := desk.log_path.read_text()):
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    return text


def create(desk: TicketDesk, key: str, verify: ssl.SSLContext) -> httpx.Response:
    """POST /tickets over https with a fresh credential, trusting ``verify``."""
    token = sign(make_claims(key=key))
    return httpx.post(
        f"{desk.url}/tickets",
        content=encoded(BODY),  # the bytes the credential's body_sha256 names
        headers={
            "Authorization": f"Bearer {token}",
            "Idempotency-Key": key,
            "Content-Type": "application/json",
        },
        verify=verify,
        timeout=10,
    )


def test_the_desk_serves_https_and_the_harness_trusts_its_ca(
    tls_desk: TicketDesk, certs: CertFiles
) -> None:
    # Given: a desk started with the test CA's leaf.
    assert tls_desk.url.startswith("https://127.0.0.1:")
    tls_desk.reset()  # a control call over https, trusting the CA
    # When: a client trusting the CA creates a ticket.
    answer = create(tls_desk, "tls-1", ssl.create_default_context(cafile=certs.ca))
    # Then: it is made, and the ledger (read over https) says so.
    assert answer.status_code == 201, answer.text
    assert answer.json()["idempotency_key"] == "tls-1"
    assert tls_desk.effects()["tickets_created"] == 1


def test_a_client_of_another_ca_is_refused_and_the_desk_serves_on(
    tls_desk: TicketDesk, certs: CertFiles, tmp_path: Path
) -> None:
    # Given: a client that trusts another CA only, and one that speaks plain http.
    other = make_certificates(tmp_path, label="other")
    tls_desk.reset()
    # When: each tries the desk.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        create(tls_desk, "tls-2", ssl.create_default_context(cafile=other.ca))
    port = httpx.URL(tls_desk.url).port
    with socket.create_connection(("127.0.0.1", port or 0), timeout=10) as plain:
        plain.sendall(b"GET /_control/effects HTTP/1.0\r\n\r\n")
        while plain.recv(4096):  # perhaps an alert, then the close
            pass
    # Then: neither reached the desk's business API, the desk still serves a
    # trusting client, and it logged the failed handshakes in one line each.
    assert tls_desk.effects()["requests"] == 0
    answer = create(tls_desk, "tls-3", ssl.create_default_context(cafile=certs.ca))
    assert answer.status_code == 201, answer.text
    assert tls_desk.process.poll() is None
    log = _log_once(tls_desk, lambda text: text.count("TLS handshake:") >= 2)
    assert "Traceback" not in log


def test_a_silent_client_does_not_hold_up_the_others(
    tls_desk: TicketDesk, certs: CertFiles
) -> None:
    """The handshake runs in the connection's thread: the accept loop does not wait."""
    port = httpx.URL(tls_desk.url).port or 0
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        # While a connection sends nothing, another client is served.
        answer = create(tls_desk, "tls-4", ssl.create_default_context(cafile=certs.ca))
        assert answer.status_code in (200, 201), answer.text


@pytest.mark.parametrize(
    "arguments",
    [
        ["--tls-cert", "cert.pem"],
        ["--tls-key", "key.pem"],
        ["--tls-cert", "missing.pem", "--tls-key", "missing.pem"],
    ],
)
def test_an_incomplete_or_unreadable_tls_setting_is_refused(
    arguments: list[str], tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ticketdesk", "--port", "0", "--keys", "keys.json",
         *arguments],
        cwd=REPO, capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip

    assert result.returncode == 2
    assert "tls" in result.stderr.lower()
    assert result.stdout == ""
