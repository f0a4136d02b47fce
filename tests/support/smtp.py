"""A real SMTP server on 127.0.0.1 (aiosmtpd) that keeps what it receives, and
the fixture that points Django's SMTP backend at it (routing's notifications,
invitations)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from tests.support.net import free_port


@dataclass
class Inbox:
    """What the SMTP server received: (envelope recipients, parsed message, raw)."""

    messages: list[tuple[list[str], Message, bytes]] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw = envelope.original_content or envelope.content
        self.messages.append(
            (list(envelope.rcpt_tos), message_from_bytes(raw), bytes(raw))
        )
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp(settings: Any) -> Iterator[Inbox]:
    """aiosmtpd on a free port; Django's SMTP backend pointed at it."""
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    try:
        yield inbox
    finally:
        controller.stop()
