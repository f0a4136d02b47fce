"""A tenant administrator in Chromium: issues and revokes a key, publishes a contract,
and finds each change in the audit trail under their own name. Never a superuser."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from audit.models import Event
from portal import services as portal_services
from portal.models import Agent, AgentKey, Role
from tasks.models import Contract
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import report_shot
from tests.support.contracts import SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_tenant_admin_issues_and_revokes_a_key_and_publishes_a_contract(
    page, live_server, tenant
):
    # Given a tenant admin (a member, not a superuser) and an agent of the tenant
    ada = User.objects.create_user("ada", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=ada, role=Role.ADMIN)
    agent = portal_services.agent_create(tenant=tenant, name="triage-bot")
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, live_server, "ada")

    # When she issues a key from the agents page
    page.goto(f"{live_server.url}/admin/portal/agent/")
    page.check(f"input[name=_selected_action][value='{agent.pk}']")
    page.select_option("select[name=action]", "issue_key")
    page.click("button[name=index]")
    assert "not shown again" in page.inner_text("#new-keys-note")
    assert "triage-bot" in page.inner_text("#new-keys")
    secret = page.inner_text("#new-keys code.new-key-secret")
    # shown once: coming back to the list (a GET; a reload would post the action
    # again and issue a second key) shows no secret
    page.goto(f"{live_server.url}/admin/portal/agent/")
    assert secret not in page.content()

    # and revokes it from the keys page
    key = AgentKey.objects.get(agent=agent)
    page.goto(f"{live_server.url}/admin/portal/agentkey/")
    page.check(f"input[name=_selected_action][value='{key.pk}']")
    page.select_option("select[name=action]", "revoke_keys")
    page.click("button[name=index]")
    assert "revoked" in page.inner_text("ul.messagelist")

    # and adds and publishes a contract version
    page.goto(f"{live_server.url}/admin/tasks/contract/add/")
    page.select_option("select[name=tenant]", str(tenant.pk))
    page.fill("input[name=key]", "refund")
    page.fill("textarea[name=spec]", json.dumps(SPEC))
    page.check("input[name=publish]")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist")
    contract = Contract.objects.get(tenant=tenant, key="refund")
    assert contract.status == "published"

    # Then each change is an event naming her, and the event browser shows them
    mine = Event.objects.filter(tenant=tenant, actor_type="user", actor_id=str(ada.pk))
    assert set(mine.values_list("code", flat=True)) == {
        "agent_key.issued",
        "agent_key.revoked",
        "contract.created",
    }
    assert secret not in json.dumps(list(mine.values_list("payload", flat=True)))
    page.goto(f"{live_server.url}/admin/audit/event/")
    listing = page.inner_text("#result_list")
    for code in ("agent_key.issued", "agent_key.revoked", "contract.created"):
        assert code in listing
    report_shot(page, "tenant-admin-events.png", full_page=True)
    # and a revoked key no longer authenticates
    assert AgentKey.objects.get(pk=key.pk).revoked_at is not None
    assert Agent.objects.get(pk=agent.pk).is_active
