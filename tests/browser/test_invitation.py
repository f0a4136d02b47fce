"""Inviting a member, in Chromium: the admin invites an address, the link is taken
from the e-mail a real SMTP server received and opened in a fresh browser, the
person makes an account and lands in the tenant's portal; a reviewer of the tenant
and the admin of another tenant cannot invite into it (docs/portal.md, "Inviting a
member")."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User

from portal import services as portal_services
from portal.models import Membership, Role
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot
from tests.support.smtp import Inbox, smtp  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "/admin/portal/invitation/add/"


def test_an_invited_person_makes_an_account_and_lands_in_the_tenant(
    browser: Any,
    page: Any,
    live_server: Any,
    tenant: Any,
    other_tenant: Any,
    smtp: Inbox,  # noqa: F811
    settings: Any,
):
    settings.PORTAL_PUBLIC_URL = live_server.url  # the link points at this server
    ada = User.objects.create_user("ada", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=ada, role=Role.ADMIN)
    page.set_viewport_size({"width": 1366, "height": 800})

    # Given Ada, the tenant's admin, fills the invite page
    log_in(page, live_server, "ada")
    page.goto(f"{live_server.url}{ADD}")
    page.select_option("select[name=tenant]", str(tenant.pk))
    page.fill("#id_email", "carol@example.com")
    page.select_option("select[name=role]", Role.SUPPORT)
    docs_shot(page, "invitation-add.png", full_page=True)
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/portal/invitation/")
    assert "Invitation e-mailed to carol@example.com" in page.inner_text(
        "ul.messagelist"
    )

    # When Carol opens the link from the e-mail in her own browser
    assert len(smtp.messages) == 1
    body = bytes(smtp.messages[0][1].get_payload(decode=True)).decode()
    link = re.search(r"http://\S+/invite/\S+", body)
    assert link and link.group(0).startswith(live_server.url)
    context = browser.new_context()
    carol = context.new_page()
    carol.set_default_timeout(15_000)
    carol.set_viewport_size({"width": 1366, "height": 800})
    carol.goto(link.group(0))
    offer = carol.inner_text("#invitation-offer")
    assert tenant.name in offer and "Support staff" in offer and "ada" in offer
    # And chooses a username and password
    carol.fill("#id_new-username", "carol")
    carol.fill("#id_new-password1", "invited-Sunflower-42")
    carol.fill("#id_new-password2", "invited-Sunflower-42")
    docs_shot(carol, "invitation-accept.png", full_page=True)
    carol.click("#create-account")

    # Then she lands in the portal, signed in, a member of the tenant
    carol.wait_for_url(f"{live_server.url}/admin/")
    assert f"Welcome to {tenant.name}" in carol.inner_text("ul.messagelist")
    assert "welcome, carol" in carol.inner_text("#user-tools").lower()
    assert (
        Membership.objects.get(tenant=tenant, user__username="carol").role
        == Role.SUPPORT
    )
    # And the link works once
    carol.goto(link.group(0))
    assert "accepted already" in carol.inner_text("#invitation-refused")
    context.close()


def test_a_reviewer_or_another_tenants_admin_cannot_invite(
    browser: Any, page: Any, live_server: Any, tenant: Any, other_tenant: Any
):
    rex = User.objects.create_user("rex", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=rex, role=Role.REVIEWER)
    olga = User.objects.create_user("olga", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=other_tenant, user=olga, role=Role.ADMIN)
    # A reviewer of the tenant: refused
    log_in(page, live_server, "rex")
    response = page.goto(f"{live_server.url}{ADD}")
    assert response.status == 403
    # The admin of another tenant may invite to hers only
    context = browser.new_context()
    other = context.new_page()
    log_in(other, live_server, "olga")
    other.goto(f"{live_server.url}{ADD}")
    choices = other.locator("select[name=tenant] option").all_inner_texts()
    assert other_tenant.slug in choices and tenant.slug not in choices
    context.close()
