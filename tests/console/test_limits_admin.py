"""The kill switch and the limits in the admin: a tenant admin's buttons and pages,
each change one event naming the person; other roles and tenants are refused."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import Event, EventCode
from limits.models import Budget, LimitUsage, RateLimit
from portal import services as portal_services
from portal.models import Agent, Tenant

from .conftest import Cast

pytestmark = pytest.mark.django_db


def _freeze(client: Client, url: str, action: str, pk: object) -> None:
    response = client.post(url, {"action": action, "_selected_action": [str(pk)]})
    assert response.status_code == 302


def test_a_tenant_admin_freezes_and_unfreezes_an_agent_with_the_buttons(cast: Cast):
    agent = portal_services.agent_create(tenant=cast.a, name="refunder")
    client = cast.client("admin_a")
    _freeze(client, "/admin/portal/agent/", "freeze", agent.pk)
    agent.refresh_from_db()
    assert agent.frozen_at is not None
    assert agent.frozen_by_id == cast.people["admin_a"].user.pk
    _freeze(client, "/admin/portal/agent/", "unfreeze", agent.pk)
    agent.refresh_from_db()
    assert agent.frozen_at is None
    events = Event.objects.filter(tenant=cast.a, code=EventCode.AGENT_CHANGED)
    assert [(e.payload["frozen"], e.actor_id) for e in events.order_by("id")] == [
        (True, str(cast.people["admin_a"].user.pk)),
        (False, str(cast.people["admin_a"].user.pk)),
    ]


@pytest.mark.parametrize("persona", ["reviewer_a", "support_a", "member_of_b_only"])
def test_other_roles_and_tenants_cannot_freeze(cast: Cast, persona: str):
    agent = portal_services.agent_create(tenant=cast.a, name="refunder")
    client = cast.client(persona)
    client.post(
        "/admin/portal/agent/", {"action": "freeze", "_selected_action": [agent.pk]}
    )
    client.post(
        "/admin/portal/tenant/", {"action": "freeze", "_selected_action": [cast.a.pk]}
    )
    assert Agent.objects.get(pk=agent.pk).frozen_at is None
    assert Tenant.objects.get(pk=cast.a.pk).frozen_at is None


def test_a_tenant_admin_freezes_the_tenant(cast: Cast):
    client = cast.client("admin_a")
    _freeze(client, "/admin/portal/tenant/", "freeze", cast.a.pk)
    assert Tenant.objects.get(pk=cast.a.pk).frozen_at is not None
    assert Tenant.objects.get(pk=cast.b.pk).frozen_at is None
    (event,) = Event.objects.filter(tenant=cast.a, code=EventCode.TENANT_CHANGED)
    assert event.reason_code == "TENANT_FROZEN"


def test_an_admin_adds_changes_and_deletes_a_limit_each_an_event(cast: Cast):
    agent = portal_services.agent_create(tenant=cast.a, name="refunder")
    client = cast.client("admin_a")
    added = client.post(
        "/admin/limits/budget/add/",
        {"agent": agent.pk, "action": "refund", "target": "*", "argument": "amount",
         "max_total": "500", "window_s": "86400"},
    )  # fmt: skip
    assert added.status_code == 302, added.content
    budget = Budget.objects.get(agent=agent)
    changed = client.post(
        f"/admin/limits/budget/{budget.pk}/change/",
        {"action": "refund", "target": "*", "argument": "amount",
         "max_total": "250", "window_s": "86400"},
    )  # fmt: skip
    assert changed.status_code == 302, changed.content
    assert Budget.objects.get(pk=budget.pk).max_total == 250
    _freeze(client, "/admin/limits/budget/", "delete_limits", budget.pk)
    assert not Budget.objects.filter(pk=budget.pk).exists()
    changes = [
        e.payload["change"]
        for e in Event.objects.filter(
            tenant=cast.a, code=EventCode.AGENT_CHANGED
        ).order_by("id")
    ]
    assert changes == ["budget.saved", "budget.saved", "budget.deleted"]


def test_the_limit_page_shows_the_usage_to_a_reviewer_and_not_to_support(cast: Cast):
    agent = portal_services.agent_create(tenant=cast.a, name="caller")
    limit = RateLimit.objects.create(
        tenant=cast.a, agent=agent, action="a", max_calls=9
    )
    LimitUsage.objects.create(
        tenant=cast.a, rate_limit=limit, window_start="2026-01-01T00:00:00Z", used=4,
        allowed=9,
    )  # fmt: skip
    page = cast.client("reviewer_a").get(f"/admin/limits/ratelimit/{limit.pk}/change/")
    assert page.status_code == 200
    assert b"4 of 9 since 2026-01-01 00:00:00 UTC" in page.content
    assert cast.client("support_a").get("/admin/limits/ratelimit/").status_code == 403
    other = cast.client("member_of_b_only").get(
        f"/admin/limits/ratelimit/{limit.pk}/change/"
    )
    assert other.status_code in (302, 404)
