"""The policy transport's SSL context is loaded once per process and CA setting:
every transport shares it, and another ``SSL_CERT_FILE`` gets its own context that
trusts that CA (docs/performance.md, issue 20)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from tasks import outbound
from tests.support.tls import make_certificates


def _context_of(transport: object) -> ssl.SSLContext:
    return transport._pool._ssl_context  # type: ignore[attr-defined]


def test_transports_share_one_context_per_ca_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given: no CA named in the environment (certifi's bundle).
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    # When: two transports are made, as two gateway calls make them.
    first, second = outbound.transport(), outbound.transport()
    # Then: one context, verifying certificates and names.
    shared = _context_of(first)
    assert _context_of(second) is shared
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname

    # Given: a test CA named by SSL_CERT_FILE.
    certs = make_certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca))
    # When/then: transports now share another context, which trusts that CA alone.
    own = _context_of(outbound.transport())
    assert own is not shared
    assert _context_of(outbound.transport()) is own
    (trusted,) = own.get_ca_certs()
    assert ("commonName", "ticketdesk test CA") in [
        pair for rdn in trusted["subject"] for pair in rdn
    ]
