"""Sending notifications: e-mail through Django's mail, webhooks over HTTP.

The notifications table is the outbox (``routing.models.Notification``). A pass
claims due rows in one short transaction (``FOR UPDATE SKIP LOCKED``, leased),
sends with no transaction open, then records each result in its own: ``sent``, or
a doubling wait up to ``PORTAL_NOTIFY_BACKOFF_CAP_S`` and ``dead`` after
``PORTAL_NOTIFY_MAX_ATTEMPTS``. At least once: a worker killed after sending and
before recording sends again once the lease lapses; the row id goes out as the
e-mail's ``Message-ID`` and the webhook's ``X-Portal-Delivery`` /
``Idempotency-Key``, so a receiver can drop the repeat. A row already ``sent`` is
never sent again, whatever restarts.

This module calls out, so it sits above ``tasks``: webhooks go through the
gateway's outbound URL policy (``tasks.outbound``), the same as connectors.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

import httpx
from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import EmailMessage, get_connection
from django.db import connection, transaction

from audit import relay
from audit.redaction import tenant_key
from portal import db as portal_db
from portal import scope
from tasks import outbound
from tasks.exceptions import OutboundRefused

from .exceptions import SendFailed
from .models import Channel, GroupMember, Notification, NotificationState, Webhook

_CLAIM: Final = """
UPDATE routing_notification n
SET attempts = n.attempts + 1,
    available_at = app_now() + make_interval(secs => %(lease)s)
WHERE n.id IN (
    SELECT id FROM routing_notification
    WHERE state = 'pending' AND available_at <= app_now()
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING n.id
"""

# The audit relay's backoff, the same expression (one definition of the wait).
_RECORD_FAILURE: Final = f"""
UPDATE routing_notification
SET state = CASE WHEN attempts >= %(max)s THEN 'dead' ELSE 'pending' END,
    available_at = {relay.BACKOFF_UNTIL_SQL},
    last_error = %(error)s
WHERE id = %(id)s AND state = 'pending'
"""


def webhook_secret(*, webhook: Webhook) -> str:
    """The webhook's HMAC secret (hex): derived from the server secret, never stored.

    The admin shows it to the tenant admin, who gives it to the receiver.
    """
    return tenant_key(webhook.tenant_id, purpose=f"routing.webhook:{webhook.pk}").hex()


def webhook_signature(*, secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=`` and the hex HMAC-SHA256 of ``timestamp.body`` under ``secret``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


_WORDS: Final = {
    "desk.item_assigned": "New desk item",
    "desk.item_reassigned": "Desk item moved",
    "desk.item_reminded": "Reminder: desk item waiting",
    "desk.item_escalated": "SLA breached: desk item escalated",
}


def message_text(facts: Mapping[str, Any]) -> tuple[str, str]:
    """(subject, body) from a notification's facts: codes, ids and the link only."""
    subject = (
        f"{_WORDS.get(facts['event'], facts['event'])}: "
        f"{facts['reason_code'] or 'no reason code'} for {facts['group']}"
    )
    body = "\n".join(
        [
            subject,
            f"Item: {facts['item_kind']} {facts['item_id']}",
            f"Task: {facts['task_id'] or '-'}",
            f"Due by: {facts['escalate_at']}",
            f"Open it: {facts['link']}",
        ]
    )
    return subject, body


def _send_email(notification: Notification) -> None:
    user = User.objects.filter(pk=int(notification.recipient)).first()
    if user is None or not user.email:
        return  # nobody to tell any more: nothing to retry
    if not GroupMember.objects.filter(
        tenant_id=notification.tenant_id, user_id=user.pk, email_enabled=True
    ).exists():
        return  # they turned e-mail off (or left) in every group since: dropped
    subject, body = message_text(notification.facts)
    message = EmailMessage(
        subject=subject,
        body=body,
        to=[user.email],
        headers={"Message-ID": f"<{notification.pk}@portal.notifications>"},
        connection=get_connection(timeout=settings.PORTAL_NOTIFY_TIMEOUT_S),
    )
    try:
        message.send()
    except OSError as error:  # smtplib's errors are OSErrors
        raise SendFailed(f"smtp: {error}") from error


def _send_webhook(notification: Notification) -> None:
    webhook = Webhook.objects.filter(
        tenant_id=notification.tenant_id, pk=notification.recipient, enabled=True
    ).first()
    if webhook is None:
        return  # removed or switched off since: nothing to retry
    problem = outbound.base_url_problem(webhook.url)
    if problem:
        raise SendFailed(f"outbound policy: {problem}")
    subject, body_text = message_text(notification.facts)
    body = json.dumps(
        {
            "text": subject,
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": body_text}}
            ],
        },
        separators=(",", ":"),
    ).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "X-Portal-Timestamp": timestamp,
        "X-Portal-Signature": webhook_signature(
            secret=webhook_secret(webhook=webhook), timestamp=timestamp, body=body
        ),
        "X-Portal-Delivery": str(notification.pk),
        "Idempotency-Key": str(notification.pk),
    }
    try:
        with httpx.Client(
            transport=outbound.transport(), timeout=settings.PORTAL_NOTIFY_TIMEOUT_S
        ) as client:
            answer = client.post(webhook.url, content=body, headers=headers)
    except (httpx.HTTPError, OutboundRefused) as error:
        raise SendFailed(f"webhook: {type(error).__name__}: {error}") from error
    if answer.status_code >= 300:
        raise SendFailed(f"webhook: HTTP {answer.status_code}")


SENDERS: Final[dict[str, Callable[[Notification], None]]] = {
    Channel.EMAIL: _send_email,
    Channel.WEBHOOK: _send_webhook,
}


def _claim(*, limit: int) -> list[Notification]:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(
            _CLAIM, {"lease": settings.PORTAL_NOTIFY_CLAIM_LEASE_S, "limit": limit}
        )
        ids = [row[0] for row in cursor.fetchall()]
    return list(Notification.objects.filter(pk__in=ids).order_by("pk"))


def _record_sent(notification_id: uuid.UUID) -> None:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE routing_notification SET state = 'sent', sent_at = app_now(),"
            " last_error = '' WHERE id = %s AND state = 'pending'",
            [notification_id],
        )


def _record_failure(notification_id: uuid.UUID, *, error: str) -> None:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(
            _RECORD_FAILURE,
            {
                "id": notification_id,
                "max": settings.PORTAL_NOTIFY_MAX_ATTEMPTS,
                "cap": settings.PORTAL_NOTIFY_BACKOFF_CAP_S,
                "base": settings.PORTAL_NOTIFY_BACKOFF_BASE_S,
                "error": error[:500],
            },
        )


def _no_hook(point: str) -> None:
    return None


@scope.in_tenants_with("routing_tenants_with_due_work")
def notifications_deliver_once(
    *, limit: int = 50, _test_hook: Callable[[str], None] = _no_hook
) -> dict[str, int]:
    """Claim, send and record one batch of due notifications; counts by outcome.

    Safe on many workers at once (``SKIP LOCKED`` and a lease). Named fault point:
    ``"after_send"`` (sent, not yet recorded).
    """
    portal_db.forbid_transaction("notifications go out over SMTP and HTTP")
    counts = {NotificationState.SENT: 0, "failed": 0}
    for notification in _claim(limit=limit):
        try:
            SENDERS[notification.channel](notification)
        except SendFailed as error:
            _record_failure(notification.pk, error=str(error))
            counts["failed"] += 1
            continue
        _test_hook("after_send")
        _record_sent(notification.pk)
        counts[NotificationState.SENT] += 1
    return dict(counts)
