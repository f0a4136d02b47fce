"""Reassign from the takeover desk's list (issue 24 §2, Agent Inbox): each routed row
offers its tenant's groups and desk people beside Claim / Hand back / Release, the
choices loaded once for the page (the query count does not grow with the rows);
the POST is the item page's own, back on the list. A reviewer gets no control and
403, another tenant's member no row and 404. In Chromium:
tests/browser/test_desk_list_actions.py."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import Event, EventCode
from portal.models import Role
from routing.models import Assignment
from tests.routing import conftest as routing_world
from tests.routing.conftest import escalate_with_canary

from .test_desk import DESK, make_person

pytestmark = pytest.mark.django_db

# routing's groups, rule and webhook receiver (tests/routing/conftest.py)
receiver = routing_world.receiver
desk = routing_world.desk

OPTIONS = [
    "Billing (has it now)",
    "Billing → ana",
    "Billing → bo",
    "On-call",
    "On-call → cy",
]


def _as(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _routed(desk, make_task, make_operation, n: int) -> list:
    return [
        escalate_with_canary(make_task, make_operation, desk.tenant)[0]
        for _ in range(n)
    ]


def _options(html: str, task) -> list[str]:
    select = re.search(
        rf'<select name="to" form="desk-{task.pk}-reassign".*?</select>', html, re.S
    )
    assert select, f"no reassign choice on {task.client_task_id}'s row"
    return [
        re.sub(r"\s+", " ", o).strip()
        for o in re.findall(r"<option[^>]*>(.*?)</option>", select.group(0))
    ]


def test_support_reassigns_from_the_list(desk, make_task, make_operation):
    first, second = _routed(desk, make_task, make_operation, 2)
    ana = desk.members["ana"]
    ana.is_staff = True
    ana.save(update_fields=["is_staff"])
    client = _as(ana)
    html = client.get(DESK).content.decode()
    # every routed row offers the tenant's groups and their desk people, the
    # current holder marked, and posts to the item's own reassign URL
    for task in (first, second):
        assert [o.replace("&rarr;", "→") for o in _options(html, task)] == OPTIONS
        assert f'id="desk-{task.pk}-reassign"' in html
        assert f'action="{DESK}{task.pk}/reassign/"' in html
    # when she moves the first to On-call from the list
    moved = client.post(
        f"{DESK}{first.pk}/reassign/",
        {"to": str(desk.backup.pk), "back": "list", "list_query": "dir=oldest"},
    )
    # then she is back on the list, told which task moved
    assert moved.status_code == 302
    assert moved["Location"] == f"{DESK}?dir=oldest"
    listed = client.get(moved["Location"]).content.decode()
    assert f"{first.client_task_id}: Moved" in listed
    item = Assignment.objects.get(tenant=desk.tenant, task_id=first.pk)
    assert (item.group_id, item.person_id) == (desk.backup.pk, None)
    assert Event.objects.filter(
        task_id=first.pk,
        code=EventCode.DESK_ITEM_REASSIGNED,
        actor_id=str(ana.pk),
    ).exists()
    # and the first row now shows On-call as the one that has it; the second kept
    assert "On-call (has it now)" in _options(listed, first)
    assert "Billing (has it now)" in _options(listed, second)


def test_the_choices_are_loaded_once_for_the_page(desk, make_task, make_operation):
    _routed(desk, make_task, make_operation, 2)
    admin = make_person("ada", {desk.tenant: Role.ADMIN})
    client = _as(admin)
    with CaptureQueriesContext(connection) as two:
        html = client.get(DESK).content.decode()
    assert html.count("desk-row-reassign") == 2  # a tenant admin reassigns too
    _routed(desk, make_task, make_operation, 4)
    with CaptureQueriesContext(connection) as six:
        html = client.get(DESK).content.decode()
    assert html.count("desk-row-reassign") == 6
    assert len(six.captured_queries) == len(two.captured_queries)


def test_a_reviewer_gets_no_choice_and_a_refusal(desk, make_task, make_operation):
    (task,) = _routed(desk, make_task, make_operation, 1)
    rita = make_person("rita", {desk.tenant: Role.REVIEWER})
    client = _as(rita)
    html = client.get(DESK).content.decode()
    assert task.client_task_id in html
    assert "desk-row-reassign" not in html
    refused = client.post(
        f"{DESK}{task.pk}/reassign/", {"to": str(desk.backup.pk), "back": "list"}
    )
    assert refused.status_code == 403
    item = Assignment.objects.get(tenant=desk.tenant, task_id=task.pk)
    assert item.group_id == desk.group.pk


def test_another_tenants_member_sees_no_row_and_gets_404(
    desk, other_tenant, make_task, make_operation
):
    (task,) = _routed(desk, make_task, make_operation, 1)
    olga = make_person("olga", {other_tenant: Role.ADMIN})
    client = _as(olga)
    html = client.get(DESK).content.decode()
    assert task.client_task_id not in html
    assert "Billing" not in html
    refused = client.post(
        f"{DESK}{task.pk}/reassign/", {"to": str(desk.backup.pk), "back": "list"}
    )
    assert refused.status_code == 404
    item = Assignment.objects.get(tenant=desk.tenant, task_id=task.pk)
    assert item.group_id == desk.group.pk
