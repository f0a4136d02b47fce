"""The ticket desk the tests' connectors call: one real desk process on 127.0.0.1
for the whole run (``ticketdesk_server``), reset before each test that takes it
(``desk``). ``tests/conftest.py`` registers both for every tier."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.outbound import allow as outbound_allow
from ticketdesk.harness import TicketDesk, start_ticketdesk


@pytest.fixture(scope="session")
def ticketdesk_server() -> Iterator[TicketDesk]:
    """One real ticket desk on 127.0.0.1 for the session (tests reset it)."""
    with start_ticketdesk() as desk:
        yield desk


@pytest.fixture
def desk(
    ticketdesk_server: TicketDesk, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TicketDesk]:
    """The session's desk, emptied and in the gateway's outbound allow-list."""
    outbound_allow(settings, monkeypatch, ticketdesk_server.url)
    ticketdesk_server.reset()
    yield ticketdesk_server
    ticketdesk_server.clear_faults()
