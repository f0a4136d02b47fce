"""Desk items notify their group by e-mail and webhook through the notifications
outbox: received by a real SMTP server and a real HTTP receiver, signed, sent once,
retried after a failure, and carrying nothing personal or secret (the canary)."""

from __future__ import annotations

import pytest

from audit.models import Event, EventCode
from portal.db import db_now
from routing import delivery
from routing.models import Assignment, Notification, NotificationState
from tests.support.db import db_clock_offset

from .conftest import CANARY, CUSTOMER_EMAIL, escalate_with_canary

pytestmark = pytest.mark.django_db


def test_an_escalation_notifies_its_group_by_email_and_webhook(
    desk, smtp, receiver, make_task, make_operation
):
    # given a FIELD_STALE escalation whose task, arguments and evidence hold a canary
    task, record = escalate_with_canary(make_task, make_operation, desk.tenant)

    # then it is assigned to Billing in the same transaction, with an event
    assignment = Assignment.objects.get(tenant=desk.tenant, item_id=record.pk)
    assert (assignment.group_id, assignment.task_id) == (desk.group.pk, task.pk)
    assert Event.objects.filter(
        tenant=desk.tenant, task_id=task.pk, code=EventCode.DESK_ITEM_ASSIGNED
    ).exists()

    # when the notifications go out
    counts = delivery.notifications_deliver_once()

    # then Ana (e-mail on) gets one e-mail, Bo (e-mail off) none, and the webhook
    # one signed Slack-compatible post, each with the desk link
    assert counts == {"sent": 2, "failed": 0}
    assert [rcpt for rcpt, _, _ in smtp.messages] == [["ana@support.example"]]
    _, mail, raw = smtp.messages[0]
    link = f"/admin/console/takeoveritem/{task.pk}/change/"
    assert "FIELD_STALE" in mail["Subject"] and "Billing" in mail["Subject"]
    assert link in mail.get_payload()
    assert [post["valid"] for post in receiver.posts] == [True]
    body = receiver.posts[0]["body"]
    assert "FIELD_STALE" in body["text"] and link in body["blocks"][0]["text"]["text"]

    # and nothing personal or secret left: no canary, no customer address, and no
    # member's address in the webhook
    for sent in [raw, *receiver.raw]:
        assert CANARY.encode() not in sent
        assert CUSTOMER_EMAIL.encode() not in sent
    assert b"ana@support.example" not in receiver.raw[0]


def test_a_sent_notification_is_never_sent_again(
    desk, smtp, receiver, make_task, make_operation
):
    # given the notifications of one escalation, sent
    escalate_with_canary(make_task, make_operation, desk.tenant)
    delivery.notifications_deliver_once()

    # when the worker runs again, also after its lease would have lapsed (a restart)
    again = delivery.notifications_deliver_once()
    with db_clock_offset("10 minutes"):
        later = delivery.notifications_deliver_once()

    # then nothing more leaves
    assert again == later == {"sent": 0, "failed": 0}
    assert (len(smtp.messages), len(receiver.posts)) == (1, 1)


def test_the_same_event_written_twice_makes_one_email(
    desk, smtp, receiver, make_task, make_operation
):
    # given an escalation's assignment event
    _, record = escalate_with_canary(make_task, make_operation, desk.tenant)
    assignment = Assignment.objects.get(tenant=desk.tenant, item_id=record.pk)
    event_id = Notification.objects.get(tenant=desk.tenant, channel="email").event_id

    # when its notifications are written again (a redelivered event)
    from django.db import transaction

    from routing import services as routing_services

    with transaction.atomic():
        routing_services._notify(
            tenant=desk.tenant,
            event_id=event_id,
            code=EventCode.DESK_ITEM_ASSIGNED,
            assignment=assignment,
        )
    delivery.notifications_deliver_once()

    # then one e-mail and one post went out
    assert Notification.objects.filter(tenant=desk.tenant).count() == 2
    assert (len(smtp.messages), len(receiver.posts)) == (1, 1)


def test_a_crash_after_sending_resends_under_the_same_delivery_id(
    desk, smtp, receiver, make_task, make_operation
):
    # given a worker that dies after sending and before recording
    escalate_with_canary(make_task, make_operation, desk.tenant)

    def crash(point: str) -> None:
        if point == "after_send":
            raise SystemExit("killed")

    with pytest.raises(SystemExit):
        delivery.notifications_deliver_once(_test_hook=crash)
    assert len(smtp.messages) + len(receiver.posts) == 1

    # when another worker runs before the lease lapses, then after it
    assert delivery.notifications_deliver_once() == {"sent": 0, "failed": 0}
    with db_clock_offset("2 minutes"):
        delivery.notifications_deliver_once()

    # then every row is sent, and the one repeated message carries the same id
    # (the e-mail's Message-ID, the webhook's X-Portal-Delivery) for the receiver
    assert set(
        Notification.objects.filter(tenant=desk.tenant).values_list("state", flat=True)
    ) == {NotificationState.SENT}
    ids = [mail["Message-ID"] for _, mail, _ in smtp.messages] + [
        f"<{post['delivery']}@portal.notifications>" for post in receiver.posts
    ]
    assert len(ids) == 3 and len(set(ids)) == 2


def test_a_failing_receiver_is_retried_with_backoff(
    desk, smtp, receiver, make_task, make_operation
):
    # given a webhook receiver that fails once
    receiver.fail_next = 1
    escalate_with_canary(make_task, make_operation, desk.tenant)

    # when the first pass runs
    first = delivery.notifications_deliver_once()

    # then the post is pending again, backing off, with the error kept
    assert first == {"sent": 1, "failed": 1}
    row = Notification.objects.get(tenant=desk.tenant, channel="webhook")
    assert (row.state, row.attempts) == ("pending", 1)
    assert "HTTP 500" in row.last_error
    assert delivery.notifications_deliver_once() == {"sent": 0, "failed": 0}

    # and after the wait it goes out
    with db_clock_offset("30 seconds"):
        assert delivery.notifications_deliver_once() == {"sent": 1, "failed": 0}
    row.refresh_from_db()
    assert (row.state, row.attempts) == ("sent", 2)
    assert [post["valid"] for post in receiver.posts] == [True]


def test_a_long_failing_row_waits_the_cap_without_overflowing(
    desk, smtp, receiver, make_task, make_operation, settings
):
    # given a webhook post that has failed 2000 times, with attempts left
    settings.PORTAL_NOTIFY_MAX_ATTEMPTS = 5000
    escalate_with_canary(make_task, make_operation, desk.tenant)
    Notification.objects.filter(tenant=desk.tenant, channel="webhook").update(
        attempts=2000
    )
    receiver.fail_next = 1

    # when it fails once more (2^2000 seconds would overflow a double)
    assert delivery.notifications_deliver_once() == {"sent": 1, "failed": 1}

    # then it waits the cap, as the audit relay's rows do (one backoff expression)
    row = Notification.objects.get(tenant=desk.tenant, channel="webhook")
    assert (row.state, row.attempts) == ("pending", 2001)
    wait = (row.available_at - db_now()).total_seconds()
    assert wait > settings.PORTAL_NOTIFY_BACKOFF_CAP_S - 30
    assert wait <= settings.PORTAL_NOTIFY_BACKOFF_CAP_S


def test_a_webhook_the_outbound_policy_refuses_is_not_called(
    desk, smtp, receiver, make_task, make_operation, settings
):
    # given the receiver's host is no longer allowed
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = []
    escalate_with_canary(make_task, make_operation, desk.tenant)

    # when the notifications go out
    delivery.notifications_deliver_once()

    # then the webhook was not called and the row says why
    assert receiver.posts == []
    row = Notification.objects.get(tenant=desk.tenant, channel="webhook")
    assert row.state == "pending" and "outbound policy" in row.last_error
