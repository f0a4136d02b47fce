"""The desk's Take over and Reassign buttons (console/admin/desk.py) as each role
uses them: support in the item's group takes it and moves it (each an event naming
the person, the new group told); a reviewer sees no buttons and is refused; another
tenant's member gets 404; bad input is a message, never a 500."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.models import Role
from routing.models import Assignment, Notification
from tasks.models import Task

from .conftest import escalate_with_canary

pytestmark = pytest.mark.django_db

DESK = "/admin/console/takeoveritem/"


@pytest.fixture
def escalated(desk, make_task, make_operation) -> tuple[Task, Assignment]:
    task, record = escalate_with_canary(make_task, make_operation, desk.tenant)
    return task, Assignment.objects.get(tenant=desk.tenant, item_id=record.pk)


def as_(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def person(name: str, tenant, role: Role) -> User:
    user = User.objects.create_user(name, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=user, role=role)
    return user


def moves(task: Task) -> list[Event]:
    return list(
        Event.objects.filter(task_id=task.pk, code=EventCode.DESK_ITEM_REASSIGNED)
    )


def test_support_in_the_group_takes_the_item_and_moves_it(desk, escalated):
    task, item = escalated
    ana = as_(desk.members["ana"])

    # the page offers both buttons, and every group and desk worker to move it to
    body = ana.get(f"{DESK}{task.pk}/change/").content.decode()
    assert 'id="desk-take-over"' in body and 'id="desk-reassign"' in body
    assert f'value="{desk.backup.pk}:{desk.members["cy"].pk}"' in body

    # when Ana takes it over
    response = ana.post(f"{DESK}{task.pk}/take-over/", follow=True)
    assert response.status_code == 200
    item.refresh_from_db()
    assert item.person_id == desk.members["ana"].pk
    assert "taken by ana" in response.content.decode()

    # and moves it to On-call
    ana.post(f"{DESK}{task.pk}/reassign/", {"to": str(desk.backup.pk)})

    # then On-call has it, nobody holds it, each move is an event naming Ana,
    # and On-call's Cy is told
    item.refresh_from_db()
    assert (item.group_id, item.person_id) == (desk.backup.pk, None)
    assert [(e.actor_id, e.payload.get("taken_over")) for e in moves(task)] == [
        (str(desk.members["ana"].pk), True),
        (str(desk.members["ana"].pk), None),
    ]
    assert Notification.objects.filter(
        tenant=desk.tenant,
        facts__event=EventCode.DESK_ITEM_REASSIGNED,
        recipient=str(desk.members["cy"].pk),
    ).exists()


def test_take_over_is_offered_only_to_the_items_group(desk, escalated):
    task, _ = escalated
    body = as_(desk.members["cy"]).get(f"{DESK}{task.pk}/change/").content.decode()
    assert 'id="desk-take-over"' not in body and 'id="desk-reassign"' in body
    response = as_(desk.members["cy"]).post(f"{DESK}{task.pk}/take-over/", follow=True)
    assert "Only a member of the item&#x27;s group can take it over." in (
        response.content.decode()
    )
    assert moves(task) == []


def test_a_reviewer_sees_no_buttons_and_is_refused(desk, escalated):
    task, item = escalated
    rita = as_(person("rita", desk.tenant, Role.REVIEWER))
    body = rita.get(f"{DESK}{task.pk}/change/").content.decode()
    assert "desk-sla-group" in body  # reads the item and its clock
    assert 'id="desk-take-over"' not in body and 'id="desk-reassign"' not in body
    assert rita.post(f"{DESK}{task.pk}/take-over/").status_code == 403
    response = rita.post(f"{DESK}{task.pk}/reassign/", {"to": str(desk.backup.pk)})
    assert response.status_code == 403
    item.refresh_from_db()
    assert (item.group_id, item.person_id) == (desk.group.pk, None)
    assert moves(task) == []


def test_another_tenants_member_gets_404_and_changes_nothing(
    desk, escalated, other_tenant
):
    task, item = escalated
    olga = as_(person("olga", other_tenant, Role.ADMIN))
    # the admin's "doesn't exist" (a redirect home), as for a random id
    shown = olga.get(f"{DESK}{task.pk}/change/", follow=True)
    assert shown.redirect_chain == [("/admin/", 302)]
    assert "Perhaps it was deleted" in shown.content.decode()
    assert "desk-sla" not in shown.content.decode()
    assert olga.post(f"{DESK}{task.pk}/take-over/").status_code == 404
    response = olga.post(f"{DESK}{task.pk}/reassign/", {"to": str(desk.backup.pk)})
    assert response.status_code == 404
    item.refresh_from_db()
    assert (item.group_id, item.person_id) == (desk.group.pk, None)
    assert moves(task) == []


@pytest.mark.parametrize(
    ("to", "message"),
    [
        ("", "Choose a group or a person"),
        ("not-a-group", "Choose a group or a person"),
        ("01a2f000-0000-7000-8000-000000000000", "No such group in this tenant."),
        ("{backup}:{ana}", "That person is not in the group"),
    ],
)
def test_bad_targets_are_messages_not_500s(desk, escalated, to, message):
    task, item = escalated
    to = to.format(backup=desk.backup.pk, ana=desk.members["ana"].pk)
    response = as_(desk.members["ana"]).post(
        f"{DESK}{task.pk}/reassign/", {"to": to}, follow=True
    )
    assert response.status_code == 200
    assert message in response.content.decode()
    item.refresh_from_db()
    assert (item.group_id, item.person_id) == (desk.group.pk, None)
    assert moves(task) == []
