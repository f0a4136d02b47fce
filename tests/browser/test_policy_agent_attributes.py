"""What the policies read of an agent, set in Chromium: a tenant administrator (not
a superuser) gives the agent a trust tier and tags on its admin page; one
``agent.changed`` event names them (docs/policies.md, "The entity model")."""

from __future__ import annotations

import pytest

from audit.models import Event, EventCode
from portal.models import Agent, Role
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot
from tests.console.test_desk import make_person

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_tenant_admin_sets_the_agents_trust_tier_and_tags(
    page, live_server, tenant, make_agent
):
    agent = make_agent(tenant=tenant, grants=("create_ticket",))
    admin = make_person("tia", {tenant: Role.ADMIN}, password=PASSWORD)
    log_in(page, live_server, "tia")
    page.set_viewport_size({"width": 1366, "height": 800})
    page.goto(f"{live_server.url}/admin/portal/agent/{agent.pk}/change/")
    page.select_option("#id_trust_tier", "trusted")
    page.fill("#id_tags", "refunds,billing")
    docs_shot(page.locator("#agent_form"), "policy-4-agent-attributes.png")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist")
    agent = Agent.objects.get(pk=agent.pk)
    assert (agent.trust_tier, agent.tags) == ("trusted", ["refunds", "billing"])
    [event] = Event.objects.filter(tenant=tenant, code=EventCode.AGENT_CHANGED)
    assert event.actor_id == str(admin.pk)
    assert event.payload["tags"] == ["refunds", "billing"]
