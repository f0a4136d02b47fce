"""The admin as a person uses it: log in, read the audit trail, fail to change it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from audit import services as audit_services
from portal import services as portal_services
from portal.actors import Actor
from portal.models import Role
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import report_shot

pytestmark = pytest.mark.django_db(transaction=True)


def log_in_as_member(page, live_server, tenant, role: Role = Role.REVIEWER) -> None:
    """As a member of the tenant with ``role`` (never a superuser)."""
    ana = User.objects.create_user("ana", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=ana, role=role)
    log_in(page, live_server, "ana")


def test_a_reviewer_reads_an_event_and_cannot_change_or_delete_it(
    page, live_server, tenant
):
    with transaction.atomic():
        event_id = audit_services.event_append(
            tenant_id=tenant.pk,
            code="task.registered",
            actor=Actor.system("browser"),
            data={"client_task_id": "issue-1042", "api_key": "agp_0123456789ab.x"},
        )
    log_in_as_member(page, live_server, tenant)
    page.click("#content-main a:text-is('Events')")  # the app list's link
    page.wait_for_selector("#result_list")
    assert "task.registered" in page.inner_text("#result_list")
    page.click(f"a[href$='/audit/event/{event_id}/change/']")
    body = page.inner_text("#content")
    assert "issue-1042" in body
    assert "agp_0123456789ab" not in page.content()  # redacted before it was stored
    assert page.locator("input[name=_save]").count() == 0
    assert page.locator("a.deletelink").count() == 0
    report_shot(page, "admin-event.png", full_page=True)
    response = page.goto(f"{live_server.url}/admin/audit/event/{event_id}/delete/")
    assert response is not None and response.status == 403


def test_an_admin_issues_an_agent_key_and_sees_it_once(page, live_server, agent):
    log_in_as_member(page, live_server, agent.tenant, Role.ADMIN)
    page.goto(f"{live_server.url}/admin/portal/agent/")
    page.check(f"input[name=_selected_action][value='{agent.pk}']")
    page.select_option("select[name=action]", "issue_key")
    page.click("button[name=index]")
    secret = page.inner_text("#new-keys code.new-key-secret")
    assert secret.startswith("agp_")
    page.reload()
    assert secret not in page.content()  # shown once, stored only as a hash
