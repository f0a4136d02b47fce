"""The desk shows who has an item and its SLA clock: to reviewers, support and
admins of the tenant, never to another tenant's member."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal import services as portal_services
from portal.models import Role
from routing import services as routing_services
from tests.support.db import db_clock_offset

from .conftest import CANARY, escalate_with_canary

pytestmark = pytest.mark.django_db

DESK = "/admin/console/takeoveritem/"


def client_of(name: str, memberships: dict) -> Client:
    user = User.objects.create_user(name, is_staff=True)
    for tenant, role in memberships.items():
        portal_services.membership_grant(tenant=tenant, user=user, role=role)
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("role", [Role.REVIEWER, Role.SUPPORT, Role.ADMIN])
def test_the_item_page_and_the_list_show_the_group_and_the_clock(
    desk, make_task, make_operation, role
):
    # given a FIELD_STALE item routed to Billing (escalates after 5 min)
    task, _ = escalate_with_canary(make_task, make_operation, desk.tenant)
    client = client_of(f"person-{role}", {desk.tenant: role})

    # when the person opens the item and the list
    page = client.get(f"{DESK}{task.pk}/change/").content.decode()
    listing = client.get(DESK).content.decode()

    # then both name the group and the time left
    assert 'id="desk-sla-group">Billing<' in page
    assert "due in 5 min" in page
    assert "Billing: due in 5 min" in listing
    assert CANARY not in page.split('id="desk-sla"')[1].split("</p>")[0]


def test_the_clock_runs_on_the_database_clock_and_shows_the_escalation(
    desk, make_task, make_operation
):
    # given an item past both deadlines, swept
    task, _ = escalate_with_canary(make_task, make_operation, desk.tenant)
    client = client_of("sam", {desk.tenant: Role.SUPPORT})
    with db_clock_offset(420):
        routing_services.sla_sweep()

        # when support opens it
        page = client.get(f"{DESK}{task.pk}/change/").content.decode()
        listing = client.get(DESK).content.decode()

    # then it is On-call's, overdue by 2 minutes, reminded and escalated
    assert 'id="desk-sla-group">On-call<' in page
    assert "overdue by 2 min" in page
    assert "reminded, escalated" in page
    assert "On-call: overdue by 2 min (reminded, escalated)" in listing


def test_another_tenants_member_sees_neither_the_item_nor_its_clock(
    desk, make_task, make_operation, other_tenant
):
    task, _ = escalate_with_canary(make_task, make_operation, desk.tenant)
    client = client_of("eve", {other_tenant: Role.ADMIN})

    page = client.get(f"{DESK}{task.pk}/change/")
    listing = client.get(DESK).content.decode()

    assert page.status_code in (302, 404)
    assert "Billing" not in listing


def test_the_dashboard_counts_the_items_past_their_sla(
    desk, make_task, make_operation, other_tenant
):
    # given two items of the tenant, and a reviewer of it and of another tenant
    for _ in range(2):
        escalate_with_canary(make_task, make_operation, desk.tenant)
    client = client_of(
        "rita", {desk.tenant: Role.REVIEWER, other_tenant: Role.REVIEWER}
    )
    cell = f'id="dash-sla-overdue-{desk.tenant.slug}">'

    # when the front page is read before and after the 5-minute deadline
    before = client.get("/admin/").content.decode()
    with db_clock_offset(301):
        after = client.get("/admin/").content.decode()

    # then the tenant's "past SLA" figure goes from 0 to 2; the other stays 0
    assert f"{cell}0<" in before
    assert f"{cell}2<" in after
    assert f'id="dash-sla-overdue-{other_tenant.slug}">0<' in after
