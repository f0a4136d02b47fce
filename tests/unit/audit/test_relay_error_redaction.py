"""A broker error that quotes what it refused is stored and logged redacted."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pytest
from django.db import transaction

from audit import relay
from audit import services as audit_services
from audit.exceptions import PublishFailed
from audit.models import Outbox
from portal.actors import Actor

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "ghp_Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc8Vb7"
EMAIL = "quoted.person@example.org"


class QuotingPublisher:
    """A broker stand-in that refuses every message, quoting it in its error."""

    def publish_wave(
        self,
        messages: Sequence[relay.ClaimedMessage],
        *,
        meanwhile: Callable[[], None] | None = None,
    ) -> list[PublishFailed | None]:
        if meanwhile is not None:
            meanwhile()
        return [
            PublishFailed(
                f"refused {message.id}: sent by {EMAIL} with {TOKEN}",
                connection_lost=False,
            )
            for message in messages
        ]


def test_the_error_of_a_refused_message_is_redacted_before_it_is_stored(
    tenant, settings, caplog
):
    # given one outbox row, and a relay that buries it at its first failure
    settings.PORTAL_OUTBOX_MAX_ATTEMPTS = 1
    caplog.set_level(logging.DEBUG)
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk, code="task.woken", actor=Actor.system("test")
        )
    # when the broker refuses it with an error that quotes secrets
    report = relay.outbox_relay_once(publisher=QuotingPublisher())
    # then the stored error and the log line keep the facts, not the values
    assert report.failed == 1 and report.dead == 1
    (error,) = Outbox.objects.filter(tenant=tenant).values_list("last_error", flat=True)
    assert error.startswith("refused ") and "[REDACTED:github]" in error
    assert TOKEN not in error and EMAIL not in error
    assert TOKEN not in caplog.text and EMAIL not in caplog.text
    assert "[email:hm_" in caplog.text
