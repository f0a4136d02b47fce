"""Approvals are routed like desk items (issue 22): the group the policy names is
told by e-mail and signed webhook the moment the approval is asked (nothing of what
is asked leaves), reminded and escalated to the backup group on the SLA of the
``APPROVAL_REQUIRED`` rule, and an approval nobody decides is recorded expired by the
SLA sweep's job, never rejected. The approvals page shows the clock.

The approval is asked for real: a policy's ``@approval("finance")`` refuses a refund
of 700 through the REST API against the real ticket desk; e-mail goes to a real
aiosmtpd, the webhook to a real HTTP receiver that checks the signature.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.models import Role
from routing import delivery, jobs
from routing import services as routing_services
from routing.models import (
    Assignment,
    Group,
    ItemKind,
    Notification,
    RoutingRule,
    Webhook,
)
from tasks.models import Approval
from tests.api.test_approvals import REFUNDS, publish, with_amount
from tests.gateway import conftest as gateway_world
from tests.gateway.conftest import World
from tests.support import desk as shared_desk
from tests.support.db import db_clock_offset

from .conftest import CANARY, Inbox, Receiver

pytestmark = pytest.mark.django_db(transaction=True)

desk = shared_desk.desk  # the ticket desk, not routing's desk fixture
world = gateway_world.world

APPROVALS_PAGE = "/admin/tasks/approval/waiting/"


@dataclass
class Approvers:
    finance: Group
    leads: Group
    webhook: Webhook
    fay: User  # in finance, wants e-mail
    lee: User  # in Finance leads, the backup


def staff(world: World, name: str, group: Group) -> User:
    user = User.objects.create_user(
        name, email=f"{name}@support.example", password="pw-for-tests-only-1"
    )
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    portal_services.membership_grant(tenant=world.tenant, user=user, role=Role.SUPPORT)
    routing_services.group_member_add(tenant=world.tenant, group=group, user=user)
    return user


@pytest.fixture
def approvers(world: World, receiver: Receiver) -> Approvers:
    """APPROVAL_REQUIRED items: remind after 60 s, escalate after 300 s to Finance
    leads; the rule's own group is the desk's, so only the policy's names finance."""
    tenant = world.tenant
    finance = Group.objects.create(tenant=tenant, name="finance")
    leads = Group.objects.create(tenant=tenant, name="Finance leads")
    desk_group = Group.objects.create(tenant=tenant, name="Approvals desk")
    RoutingRule.objects.create(
        tenant=tenant,
        reason_code="APPROVAL_REQUIRED",
        group=desk_group,
        backup_group=leads,
        remind_after_s=60,
        escalate_after_s=300,
    )
    webhook = Webhook.objects.create(tenant=tenant, url=receiver.url)
    receiver.secret = delivery.webhook_secret(webhook=webhook)
    return Approvers(
        finance=finance,
        leads=leads,
        webhook=webhook,
        fay=staff(world, "fay", finance),
        lee=staff(world, "lee", leads),
    )


def ask(world: World) -> Approval:
    """The agent's refund of 700 with the canary in its arguments: refused, asked."""
    publish(world)
    started = world.start_task(input={"summary": f"Refund {CANARY}"})
    refused = world.execute(started, with_amount(world, 700))
    assert refused.json()["code"] == "APPROVAL_REQUIRED", refused.text
    return Approval.objects.get(operation_id=started["operation"]["id"])


def item_of(approval: Approval) -> Assignment:
    return Assignment.objects.get(
        tenant_id=approval.tenant_id, item_kind=ItemKind.APPROVAL, item_id=approval.pk
    )


def approval_events(approval: Approval, code: str) -> int:
    return Event.objects.filter(
        tenant_id=approval.tenant_id, code=code, payload__item_id=str(approval.pk)
    ).count()


def test_an_approval_notifies_the_policys_group_by_email_and_webhook(
    world, approvers, smtp: Inbox, receiver: Receiver
):
    # given a policy that asks finance, when the agent's refund is refused
    approval = ask(world)

    # then the approval is assigned to finance (the policy's group, not the rule's)
    # in the same transaction, with its event
    item = item_of(approval)
    assert (item.group_id, item.reason_code) == (
        approvers.finance.pk,
        "APPROVAL_REQUIRED",
    )
    assert approval_events(approval, EventCode.DESK_ITEM_ASSIGNED) == 1

    # when the notifications go out
    delivery.notifications_deliver_once()

    # then Fay gets an e-mail and the webhook a signed post, both for the approval
    # and linking the approvals page
    mails = [
        (rcpt, mail) for rcpt, mail, _ in smtp.messages if "finance" in mail["Subject"]
    ]
    assert [rcpt for rcpt, _ in mails] == [["fay@support.example"]]
    assert APPROVALS_PAGE in mails[0][1].get_payload()
    posts = [
        post
        for post in receiver.posts
        if str(approval.pk) in post["body"]["blocks"][0]["text"]["text"]
    ]
    assert [post["valid"] for post in posts] == [True]
    assert APPROVALS_PAGE in posts[0]["body"]["blocks"][0]["text"]["text"]

    # and nothing of what is asked left: not the canary, not the amount's value
    assert approval.asked and CANARY in str(approval.asked)
    for sent in [raw for _, _, raw in smtp.messages] + receiver.raw:
        assert CANARY.encode() not in sent


def test_reminder_and_escalation_to_the_backup_group_on_the_test_clock(
    world, approvers, smtp: Inbox, receiver: Receiver
):
    # given an asked approval (remind after 60 s, escalate after 300 s)
    approval = ask(world)

    # when the SLA job runs 61 s later, twice
    with db_clock_offset(61):
        jobs.sweep_sla_job()
        jobs.sweep_sla_job()

    # then finance is reminded once
    item = item_of(approval)
    assert item.reminded_at is not None and item.escalated_at is None
    assert approval_events(approval, EventCode.DESK_ITEM_REMINDED) == 1

    # when it runs 301 s later, twice
    with db_clock_offset(301):
        jobs.sweep_sla_job()
        jobs.sweep_sla_job()

    # then the approval is Finance leads' once, and Lee is told by e-mail
    item.refresh_from_db()
    assert item.group_id == approvers.leads.pk and item.escalated_at is not None
    assert approval_events(approval, EventCode.DESK_ITEM_ESCALATED) == 1
    escalated = Notification.objects.filter(
        tenant=world.tenant,
        facts__event=EventCode.DESK_ITEM_ESCALATED,
        facts__item_id=str(approval.pk),
    )
    assert ("email", str(approvers.lee.pk)) in escalated.values_list(
        "channel", "recipient"
    )
    delivery.notifications_deliver_once()
    assert ["lee@support.example"] in [rcpt for rcpt, _, _ in smtp.messages]
    approval.refresh_from_db()
    assert approval.state == "waiting"  # the clock moves people, not the approval


def test_an_unattended_approval_is_expired_by_the_sweep(world, approvers):
    # given an asked approval (@approval_ttl_s("3600")) that nobody reads
    approval = ask(world)

    # when the SLA job runs two hours later, twice
    with db_clock_offset("2 hours"):
        jobs.sweep_sla_job()
        jobs.sweep_sla_job()

    # then it is expired once, never rejected, and its item is closed before the
    # sweep could escalate it
    approval.refresh_from_db()
    assert approval.state == "expired"
    events = Event.objects.filter(operation_id=approval.operation_id)
    assert events.filter(code=EventCode.APPROVAL_EXPIRED).count() == 1
    assert not events.filter(code=EventCode.APPROVAL_REJECTED).exists()
    assert item_of(approval).closed_at is not None
    assert approval_events(approval, EventCode.DESK_ITEM_ESCALATED) == 0


def test_the_approvals_page_shows_the_clock(world, approvers):
    # given an asked approval, reminded
    approval = ask(world)
    with db_clock_offset(61):
        jobs.sweep_sla_job()

    # when Fay opens the approvals page
    client = Client()
    client.force_login(approvers.fay)
    page = client.get(APPROVALS_PAGE)

    # then its row shows finance and the clock, as the desk does
    assert page.status_code == 200
    html = page.content.decode()
    assert str(approval.pk) in html
    assert "finance: due in 5 min (reminded)" in html


FINANCE_AND_LEGAL = (
    REFUNDS
    + """
@id("big-refunds-need-legal")
@approval("legal")
permit(principal, action == Action::"create_ticket", resource)
when { context.amounts.hasTag("amount") && context.amounts.getTag("amount") > 500 };
"""
)


def test_every_group_the_policy_names_is_told_each_person_once(
    world, approvers, smtp: Inbox, receiver: Receiver
):
    # given a policy whose two permits ask finance and legal: Fay is in finance,
    # Lou in legal, Max in both, and Bo in legal does not want e-mail
    legal = Group.objects.create(tenant=world.tenant, name="legal")
    lou = staff(world, "lou", legal)
    max_ = staff(world, "max", approvers.finance)
    routing_services.group_member_add(tenant=world.tenant, group=legal, user=max_)
    bo = staff(world, "bo", legal)
    routing_services.group_member_add(
        tenant=world.tenant, group=legal, user=bo, email_enabled=False
    )
    publish(world, FINANCE_AND_LEGAL)

    # when the agent's refund is refused for approval
    started = world.start_task(input={"summary": f"Refund {CANARY}"})
    refused = world.execute(started, with_amount(world, 700))
    assert refused.json()["code"] == "APPROVAL_REQUIRED", refused.text
    approval = Approval.objects.get(operation_id=started["operation"]["id"])
    assert approval.groups == ["finance", "legal"]

    # then finance (the first by name) holds the item, the event names legal as
    # told too, and Fay, Lou and Max get one e-mail each, Bo none
    item = item_of(approval)
    assert item.group_id == approvers.finance.pk
    assigned = Event.objects.get(
        tenant=world.tenant,
        code=EventCode.DESK_ITEM_ASSIGNED,
        payload__item_id=str(approval.pk),
    )
    assert assigned.payload["told_group_ids"] == [str(legal.pk)]
    delivery.notifications_deliver_once()
    mailed = sorted(rcpt for rcpts, _, _ in smtp.messages for rcpt in rcpts)
    assert mailed == [
        "fay@support.example",
        "lou@support.example",
        "max@support.example",
    ]
    posts = [
        post
        for post in receiver.posts
        if str(approval.pk) in post["body"]["blocks"][0]["text"]["text"]
    ]
    assert [post["valid"] for post in posts] == [True]

    # and the reminder, 61 s later, tells the same people once each again
    with db_clock_offset(61):
        jobs.sweep_sla_job()
    reminded = Notification.objects.filter(
        tenant=world.tenant,
        channel="email",
        facts__event=EventCode.DESK_ITEM_REMINDED,
        facts__item_id=str(approval.pk),
    ).values_list("recipient", flat=True)
    assert sorted(reminded) == sorted(str(u.pk) for u in (approvers.fay, lou, max_))
