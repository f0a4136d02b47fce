"""A new key's secret is shown once in the page that answers the POST, and is in no
cookie and no session row (issue 19 §1): Django's message cookie is signed, not
encrypted, so a secret flashed as a message would travel in clear base64."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session

from portal import services as portal_services
from portal.models import AgentKey, Role
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.csp import watch_violations

pytestmark = pytest.mark.django_db(transaction=True)


def _nowhere_but_the_page(page, secret: str) -> None:
    for cookie in page.context.cookies():
        assert secret not in cookie["value"], cookie["name"]
        assert secret.split(".")[-1] not in cookie["value"], cookie["name"]
    for session in Session.objects.all():
        decoded = str(session.get_decoded())
        assert secret not in session.session_data and secret not in decoded


def test_an_issued_key_is_shown_once_and_kept_nowhere(page, live_server, tenant):
    ada = User.objects.create_user("ada-keys", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=ada, role=Role.ADMIN)
    agent = portal_services.agent_create(tenant=tenant, name="triage-bot")
    violations = watch_violations(page)
    log_in(page, live_server, "ada-keys")

    page.goto(f"{live_server.url}/admin/portal/agent/")
    page.check(f"input[name=_selected_action][value='{agent.pk}']")
    page.select_option("select[name=action]", "issue_key")
    page.click("button[name=index]")

    secret = page.inner_text("#new-keys code.new-key-secret")
    assert secret.startswith("agp_")
    assert "not shown again" in page.inner_text("#new-keys-note")
    assert page.locator("ul.messagelist").count() == 0  # not a message
    _nowhere_but_the_page(page, secret)
    # A reload reads the list: no secret, and no second key issued.
    _reload_once_the_entry_points_at_the_list(page)
    assert secret not in page.content()
    assert AgentKey.objects.filter(agent=agent).count() == 1
    _nowhere_but_the_page(page, secret)
    assert violations == []


def _reload_once_the_entry_points_at_the_list(page: Any) -> None:
    """Reload as a person would: once the page has loaded, so its script has made
    the history entry a plain visit of the list (shown-once.js). Reading the secret
    off the page does not wait for that, and a reload before it posts the action
    again, which nobody can do faster than the page loads."""
    page.wait_for_load_state("load")
    page.reload()
    page.wait_for_selector("#result_list")


def test_a_rotated_key_is_shown_once_and_kept_nowhere(page, live_server, tenant):
    ada = User.objects.create_user("ada-rotate", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=ada, role=Role.ADMIN)
    agent = portal_services.agent_create(tenant=tenant, name="rotating-bot")
    old = portal_services.agent_key_issue(agent=agent).key
    log_in(page, live_server, "ada-rotate")

    page.goto(f"{live_server.url}/admin/portal/agentkey/")
    page.check(f"input[name=_selected_action][value='{old.pk}']")
    page.select_option("select[name=action]", "rotate_keys")
    until = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    page.fill("input[name=until]", until.strftime("%Y-%m-%d %H:%M"))
    page.click("button[name=index]")

    secret = page.inner_text("#new-keys code.new-key-secret")
    assert f"successor of {old.prefix}" in page.inner_text("#new-keys")
    _nowhere_but_the_page(page, secret)
    _reload_once_the_entry_points_at_the_list(page)
    assert secret not in page.content()
    assert AgentKey.objects.filter(agent=agent).count() == 2


def test_the_issue_form_sent_again_issues_no_second_key(page, live_server, tenant):
    """The browser sends the very same POST again (what a reload before the page
    has loaded, or the back button and "resend", does): its one-time token is
    spent, so no key is made and no secret shown; the list says why."""
    ada = User.objects.create_user("ada-again", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=ada, role=Role.ADMIN)
    agent = portal_services.agent_create(tenant=tenant, name="resent-bot")
    log_in(page, live_server, "ada-again")
    page.goto(f"{live_server.url}/admin/portal/agent/")
    page.check(f"input[name=_selected_action][value='{agent.pk}']")
    page.select_option("select[name=action]", "issue_key")
    with page.expect_request(lambda r: r.method == "POST") as sent:
        page.click("button[name=index]")
    first = page.inner_text("#new-keys code.new-key-secret")
    body = sent.value.post_data
    assert body is not None and "once=" in body

    again = page.request.post(
        f"{live_server.url}/admin/portal/agent/",
        data=body,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Referer": f"{live_server.url}/admin/portal/agent/",
        },
    )
    assert again.status == 200  # the list, after the redirect
    html = again.text()
    assert "This form was sent already" in html
    assert "new-key-secret" not in html and first not in html
    assert AgentKey.objects.filter(agent=agent).count() == 1
