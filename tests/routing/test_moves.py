"""People move desk items: reassign to another group and take one over, each an
event naming the person; only support and admins of the tenant, and only a member
of the item's group takes it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.models import Role
from routing import services as routing_services
from routing.exceptions import AssigneeNotAllowed, ItemClosed, NotAGroupMember
from routing.models import Assignment, Notification

from .conftest import escalate_with_canary

pytestmark = pytest.mark.django_db


@pytest.fixture
def item(desk, make_task, make_operation) -> Assignment:
    _, record = escalate_with_canary(make_task, make_operation, desk.tenant)
    return Assignment.objects.get(tenant=desk.tenant, item_id=record.pk)


def test_support_reassigns_an_item_and_the_new_group_is_told(desk, item):
    # when Ana (support, Billing) moves the item to On-call
    moved = routing_services.item_reassign(
        tenant=desk.tenant,
        assignment_id=item.pk,
        group_id=desk.backup.pk,
        user=desk.members["ana"],
    )

    # then On-call has it, one event names Ana, and Cy is told
    assert moved.group_id == desk.backup.pk and moved.person_id is None
    event = Event.objects.get(tenant=desk.tenant, code=EventCode.DESK_ITEM_REASSIGNED)
    assert (event.actor_type, event.actor_id) == ("user", str(desk.members["ana"].pk))
    assert event.payload["from_group_id"] == str(desk.group.pk)
    assert Notification.objects.filter(
        tenant=desk.tenant,
        facts__event=EventCode.DESK_ITEM_REASSIGNED,
        channel="email",
        recipient=str(desk.members["cy"].pk),
    ).exists()


def test_a_group_member_takes_an_item_over(desk, item):
    taken = routing_services.item_take_over(
        tenant=desk.tenant, assignment_id=item.pk, user=desk.members["bo"]
    )
    assert taken.person_id == desk.members["bo"].pk
    event = Event.objects.get(tenant=desk.tenant, code=EventCode.DESK_ITEM_REASSIGNED)
    assert event.payload["taken_over"] is True
    assert event.actor_id == str(desk.members["bo"].pk)


def test_someone_outside_the_group_cannot_take_it(desk, item):
    # Cy is support in the tenant but in On-call, not Billing
    with pytest.raises(NotAGroupMember):
        routing_services.item_take_over(
            tenant=desk.tenant, assignment_id=item.pk, user=desk.members["cy"]
        )


@pytest.mark.parametrize("who", ["reviewer", "outsider"])
def test_reviewers_and_other_tenants_members_move_nothing(
    desk, item, other_tenant, who
):
    user = User.objects.create_user(who, is_staff=True)
    tenant = desk.tenant if who == "reviewer" else other_tenant
    portal_services.membership_grant(
        tenant=tenant,
        user=user,
        role=Role.REVIEWER if who == "reviewer" else Role.ADMIN,
    )
    with pytest.raises(PermissionDenied):
        routing_services.item_reassign(
            tenant=desk.tenant,
            assignment_id=item.pk,
            group_id=desk.backup.pk,
            user=user,
        )
    item.refresh_from_db()
    assert item.group_id == desk.group.pk
    assert not Event.objects.filter(code=EventCode.DESK_ITEM_REASSIGNED).exists()


def test_an_item_given_to_a_person_tells_that_person_alone(desk, item):
    # when Ana gives the item to Cy in On-call
    moved = routing_services.item_reassign(
        tenant=desk.tenant,
        assignment_id=item.pk,
        group_id=desk.backup.pk,
        person_id=desk.members["cy"].pk,
        user=desk.members["ana"],
    )

    # then Cy has it; the event names Ana, the groups and the person; Cy's e-mail
    # and the webhook are the only messages
    assert (moved.group_id, moved.person_id) == (desk.backup.pk, desk.members["cy"].pk)
    event = Event.objects.get(tenant=desk.tenant, code=EventCode.DESK_ITEM_REASSIGNED)
    assert event.actor_id == str(desk.members["ana"].pk)
    assert event.payload["person_id"] == desk.members["cy"].pk
    assert event.payload["from_group_id"] == str(desk.group.pk)
    told = Notification.objects.filter(
        tenant=desk.tenant, facts__event=EventCode.DESK_ITEM_REASSIGNED
    ).values_list("channel", "recipient")
    assert sorted(told) == [
        ("email", str(desk.members["cy"].pk)),
        ("webhook", str(desk.webhook.pk)),
    ]


@pytest.mark.parametrize("who", ["outside the group", "a reviewer in the group"])
def test_an_item_goes_only_to_a_desk_worker_of_the_group(desk, item, who):
    if who == "outside the group":
        person = desk.members["ana"]  # Billing, not On-call
    else:
        person = User.objects.create_user("rex", email="rex@support.example")
        portal_services.membership_grant(
            tenant=desk.tenant, user=person, role=Role.REVIEWER
        )
        routing_services.group_member_add(
            tenant=desk.tenant, group=desk.backup, user=person
        )
    with pytest.raises(AssigneeNotAllowed):
        routing_services.item_reassign(
            tenant=desk.tenant,
            assignment_id=item.pk,
            group_id=desk.backup.pk,
            person_id=person.pk,
            user=desk.members["ana"],
        )
    item.refresh_from_db()
    assert (item.group_id, item.person_id) == (desk.group.pk, None)
    assert not Event.objects.filter(code=EventCode.DESK_ITEM_REASSIGNED).exists()


def test_a_closed_item_is_neither_moved_nor_taken(desk, item):
    Assignment.objects.filter(pk=item.pk).update(closed_at=item.assigned_at)
    with pytest.raises(ItemClosed):
        routing_services.item_take_over(
            tenant=desk.tenant, assignment_id=item.pk, user=desk.members["ana"]
        )
    with pytest.raises(ItemClosed):
        routing_services.item_reassign(
            tenant=desk.tenant,
            assignment_id=item.pk,
            group_id=desk.backup.pk,
            user=desk.members["ana"],
        )
    assert not Event.objects.filter(code=EventCode.DESK_ITEM_REASSIGNED).exists()


def test_taking_ones_own_item_again_writes_nothing(desk, item):
    for _ in range(2):
        routing_services.item_take_over(
            tenant=desk.tenant, assignment_id=item.pk, user=desk.members["ana"]
        )
    assert Event.objects.filter(code=EventCode.DESK_ITEM_REASSIGNED).count() == 1
