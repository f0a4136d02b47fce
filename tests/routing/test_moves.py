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
from routing.exceptions import NotAGroupMember
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
