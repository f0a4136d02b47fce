"""Name a test's own ticket desk in the outbound allow-list (tasks/outbound.py).

A desk the harness starts listens on 127.0.0.1 on a free port, and the gateway
calls a loopback address over http only when its ``host:port`` is named, as an
operator names the demo desk.
"""

from __future__ import annotations

from typing import Any

import pytest

from tasks import outbound


def allow(settings: Any, monkeypatch: pytest.MonkeyPatch, *urls: str) -> None:
    """Add each URL's ``host:port`` to ``PORTAL_OUTBOUND_ALLOWED_HOSTS`` for the test:
    in this process's settings and in the environment its children inherit (both
    pytest-django's and pytest's fixtures restore them afterwards)."""
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = [
        *settings.PORTAL_OUTBOUND_ALLOWED_HOSTS,
        *(outbound.host_port(url) for url in urls),
    ]
    monkeypatch.setenv(
        "PORTAL_OUTBOUND_ALLOWED_HOSTS",
        ",".join(settings.PORTAL_OUTBOUND_ALLOWED_HOSTS),
    )
