"""A person chooses the e-mail channel for themself (issue 22 §1): on the admin's
Group members page, with two actions on their own rows, each choice an event naming
them; new notifications follow it and delivery reads it again, so an e-mail queued
before someone turned e-mail off never reaches the SMTP server. Another person's
row is not theirs to change; another tenant's member does not see the rows."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.test import Client

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.models import Role
from routing import delivery
from routing import services as routing_services
from routing.models import GroupMember, Notification

from .conftest import escalate_with_canary

pytestmark = pytest.mark.django_db

MEMBERS = "/admin/routing/groupmember/"


def as_(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def row_of(desk, name: str) -> GroupMember:
    return GroupMember.objects.get(tenant=desk.tenant, user=desk.members[name])


def act(client: Client, action: str, *rows: GroupMember):
    return client.post(
        MEMBERS,
        {"action": action, "_selected_action": [str(row.pk) for row in rows]},
        follow=True,
    )


def choices(desk) -> list[Event]:
    return list(
        Event.objects.filter(
            tenant=desk.tenant,
            code=EventCode.TENANT_CHANGED,
            payload__routing="groupmember",
        ).order_by("chain_seq")  # the trail's order (ids of one millisecond may not be)
    )


def test_a_person_turns_email_on_for_themself_and_is_emailed(
    desk, smtp, receiver, make_task, make_operation
):
    # given Bo (support, Billing) who wanted no e-mail
    bo = desk.members["bo"]

    # when Bo turns e-mail on on the Group members page
    page = act(as_(bo), "email_me", row_of(desk, "bo"))

    # then the row says so and one event names Bo
    assert "Billing: e-mail on for you." in page.content.decode()
    assert row_of(desk, "bo").email_enabled is True
    [event] = choices(desk)
    assert (event.actor_id, event.payload["change"]) == (str(bo.pk), "email_enabled")

    # and the next item's e-mails reach Ana and Bo at the SMTP server
    escalate_with_canary(make_task, make_operation, desk.tenant)
    delivery.notifications_deliver_once()
    assert sorted(rcpt for rcpts, _, _ in smtp.messages for rcpt in rcpts) == [
        "ana@support.example",
        "bo@support.example",
    ]


def test_email_turned_off_after_queueing_is_not_sent(
    desk, smtp, receiver, make_task, make_operation
):
    # given an item whose e-mail to Ana is queued
    escalate_with_canary(make_task, make_operation, desk.tenant)
    assert Notification.objects.filter(
        channel="email", recipient=str(desk.members["ana"].pk)
    ).exists()

    # when Ana turns e-mail off before the worker runs
    act(as_(desk.members["ana"]), "no_email_for_me", row_of(desk, "ana"))

    # then the worker sends her nothing; the webhook still hears of the item
    delivery.notifications_deliver_once()
    assert smtp.messages == []
    assert len(receiver.posts) == 1


def test_nobody_chooses_for_someone_else_but_an_administrator(desk, other_tenant):
    # Ana selects her row and Bo's: hers changes, Bo's is skipped
    page = act(
        as_(desk.members["ana"]),
        "no_email_for_me",
        row_of(desk, "ana"),
        row_of(desk, "bo"),
    ).content.decode()
    assert "1 selected row(s) skipped: you choose for yourself only" in page
    assert row_of(desk, "ana").email_enabled is False
    assert row_of(desk, "bo").email_enabled is False  # unchanged: it was off
    act(as_(desk.members["ana"]), "email_me", row_of(desk, "bo"))
    assert row_of(desk, "bo").email_enabled is False

    # the service refuses it too, and another tenant's administrator
    olga = User.objects.create_user("olga", is_staff=True)
    portal_services.membership_grant(tenant=other_tenant, user=olga, role=Role.ADMIN)
    for who in (desk.members["ana"], olga):
        with pytest.raises(PermissionDenied):
            routing_services.member_email_choose(
                tenant=desk.tenant,
                member_id=row_of(desk, "bo").pk,
                user=who,
                email_enabled=True,
            )
    assert row_of(desk, "bo").email_enabled is False
    assert str(row_of(desk, "bo").pk) not in as_(olga).get(MEMBERS).content.decode()

    # a tenant administrator may
    ada = User.objects.create_user("ada", is_staff=True)
    portal_services.membership_grant(tenant=desk.tenant, user=ada, role=Role.ADMIN)
    routing_services.member_email_choose(
        tenant=desk.tenant,
        member_id=row_of(desk, "bo").pk,
        user=ada,
        email_enabled=True,
    )
    assert row_of(desk, "bo").email_enabled is True
    assert [e.actor_id for e in choices(desk)] == [
        str(desk.members["ana"].pk),
        str(ada.pk),
    ]


def test_a_reviewer_in_a_group_chooses_for_themself(desk):
    rex = User.objects.create_user("rex", email="rex@support.example", is_staff=True)
    portal_services.membership_grant(tenant=desk.tenant, user=rex, role=Role.REVIEWER)
    member = routing_services.group_member_add(
        tenant=desk.tenant, group=desk.backup, user=rex
    )
    act(as_(rex), "no_email_for_me", member)
    member.refresh_from_db()
    assert member.email_enabled is False
