"""The operator's new-tenant page in Chromium (docs/portal.md, "A new tenant"): the
operator makes a tenant and invites its first administrator, a taken slug is said
on its field; the invitation arrives at a real SMTP server, the administrator
opens its link in a browser of her own, makes her account and lands on her
tenant's dashboard, seeing nothing of the other tenant. A tenant's admin, reviewer
and support staff and another tenant's member get no such page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User

from portal import scope
from portal import services as portal_services
from portal.models import Membership, Role, Tenant
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot, report_shot
from tests.support.smtp import Inbox, smtp  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

NEW = "/admin/tenants/new/"


def test_the_operator_makes_a_tenant_and_its_invited_admin_lands_in_it(
    browser: Any,
    page: Any,
    live_server: Any,
    make_tenant: Any,
    fill: Any,
    smtp: Inbox,  # noqa: F811
    settings: Any,
):
    settings.PORTAL_PUBLIC_URL = live_server.url  # the link points at this server
    demo = make_tenant(slug="demo-co")
    fill(demo)  # a row on every page of the other tenant
    User.objects.create_superuser("olive", "olive@example.com", PASSWORD)
    page.set_viewport_size({"width": 1366, "height": 800})

    # Given the operator on the front page, which leads to the new-tenant page
    log_in(page, live_server, "olive")
    page.click("#to-tenant-new a")
    page.wait_for_url(f"{live_server.url}{NEW}")
    # When she asks for a slug that is taken, the form says so on the slug field
    page.fill("#id_slug", "demo-co")
    page.fill("#id_name", "Acme Ltd")
    page.fill("#id_admin_email", "ada@acme.example")
    page.click("#tenant-new-save")
    page.wait_for_selector(".field-slug .errorlist")
    assert "A tenant with the slug 'demo-co' exists." in page.inner_text(
        ".field-slug .errorlist"
    )
    assert len(smtp.messages) == 0
    docs_shot(page, "tenant-new.png", full_page=True)
    # And with a free slug the tenant is made and the invitation e-mailed
    page.fill("#id_slug", "acme")
    page.click("#tenant-new-save")
    page.wait_for_url("**/admin/portal/tenant/*/change/")
    said = page.inner_text("ul.messagelist")
    assert "Tenant 'acme' (Acme Ltd) is made" in said
    assert "e-mailed to ada@acme.example" in said
    report_shot(page, "tenant-new-done.png", full_page=True)

    # When Ada opens the link from the e-mail in her own browser
    assert len(smtp.messages) == 1
    recipients, message, _ = smtp.messages[0]
    assert recipients == ["ada@acme.example"]
    body = bytes(message.get_payload(decode=True)).decode()
    link = re.search(r"http://\S+/invite/\S+", body)
    assert link and link.group(0).startswith(live_server.url)
    context = browser.new_context()
    ada = context.new_page()
    ada.set_default_timeout(15_000)
    ada.set_viewport_size({"width": 1366, "height": 800})
    ada.goto(link.group(0))
    offer = ada.inner_text("#invitation-offer")
    assert "Acme Ltd" in offer and "Tenant administrator" in offer and "olive" in offer
    # And makes her account
    ada.fill("#id_new-username", "ada")
    ada.fill("#id_new-password1", "invited-Lighthouse-77")
    ada.fill("#id_new-password2", "invited-Lighthouse-77")
    ada.click("#create-account")

    # Then she lands on the dashboard of her tenant, signed in, its administrator
    ada.wait_for_url(f"{live_server.url}/admin/")
    assert "Welcome to Acme Ltd" in ada.inner_text("ul.messagelist")
    assert "welcome, ada" in ada.inner_text("#user-tools").lower()
    acme = Tenant.objects.get(slug="acme")
    scope.include(acme.pk)  # made by a request: the test reads it too
    assert (
        Membership.objects.get(tenant=acme, user__username="ada").role == Role.ADMIN
    )
    assert not User.objects.get(username="ada").is_superuser
    # And the page is of her tenant only: its dashboard, the pages she manages
    dashboard = ada.inner_text("#dashboard")
    assert "acme" in dashboard and "demo-co" not in dashboard
    assert ada.locator("#content-main .app-portal a", has_text="Agents").count() == 1
    assert ada.locator("#to-tenant-new").count() == 0
    report_shot(ada, "tenant-new-admin-lands.png", full_page=True)
    ada.goto(f"{live_server.url}/admin/portal/tenant/")
    rows = ada.locator("#result_list tbody tr")
    assert rows.count() == 1 and "acme" in rows.first.inner_text()
    for listing in ("portal/agent", "tasks/task", "tasks/contract", "audit/event"):
        ada.goto(f"{live_server.url}/admin/{listing}/")
        assert "demo-co" not in ada.content(), listing
    # And she gets no new-tenant page herself
    response = ada.goto(f"{live_server.url}{NEW}")
    assert response is not None and response.status == 403
    context.close()


@pytest.mark.parametrize(
    ("role", "of_other_tenant"),
    [
        (Role.ADMIN, False),
        (Role.REVIEWER, False),
        (Role.SUPPORT, False),
        (Role.ADMIN, True),
    ],
    ids=["tenant-admin", "reviewer", "support", "other-tenants-admin"],
)
def test_nobody_but_the_operator_gets_the_page(
    page: Any, live_server: Any, make_tenant: Any, role: str, of_other_tenant: bool
):
    tenant, other = make_tenant(), make_tenant()
    kim = User.objects.create_user("kim", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(
        tenant=other if of_other_tenant else tenant, user=kim, role=Role(role)
    )
    log_in(page, live_server, "kim")
    # no link on the front page
    assert page.locator("#to-tenant-new").count() == 0
    # and the page itself is refused
    response = page.goto(f"{live_server.url}{NEW}")
    assert response is not None and response.status == 403
    assert page.locator("#tenant_new_form").count() == 0
    # and so is the tenant list's "Add tenant"
    response = page.goto(f"{live_server.url}/admin/portal/tenant/add/")
    assert response is not None and response.status == 403
    assert Tenant.objects.count() == 2
