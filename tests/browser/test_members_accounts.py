"""A tenant admin adding a member, in Chromium: the add page says that the person
needs an account first and who makes it; an unknown username is refused with what
to do, and nothing is written. (Why the operator makes accounts: docs/portal.md,
"Members and accounts".)"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.models import Membership, Role
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "/admin/portal/membership/add/"


def test_a_tenant_admin_is_told_who_makes_accounts(page, live_server, tenant):
    ada = User.objects.create_user("ada", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=ada, role=Role.ADMIN)
    User.objects.create_user("bob", is_staff=True)  # an account the operator made
    page.set_viewport_size({"width": 1366, "height": 800})
    log_in(page, live_server, "ada")
    page.goto(f"{live_server.url}{ADD}")
    help_text = page.inner_text("#id_username_helptext")
    assert "need an account first" in help_text and "platform operator" in help_text

    # When she adds someone who has no account yet
    page.select_option("select[name=tenant]", str(tenant.pk))
    page.fill("#id_username", "carol")
    page.select_option("select[name=role]", Role.SUPPORT)
    page.click("input[name=_save]")
    # Then she is told what to do, and nothing is written
    message = page.inner_text("ul.messagelist")
    assert "No active account has the username 'carol'" in message
    assert "ask them to create it" in message
    assert not Membership.objects.filter(tenant=tenant, user__username="carol").exists()
    docs_shot(page, "members-need-an-account.png", full_page=True)

    # And an existing account is added, with its event
    page.goto(f"{live_server.url}{ADD}")
    page.select_option("select[name=tenant]", str(tenant.pk))
    page.fill("#id_username", "bob")
    page.select_option("select[name=role]", Role.SUPPORT)
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/portal/membership/")
    assert (
        Membership.objects.get(tenant=tenant, user__username="bob").role == Role.SUPPORT
    )
    assert Event.objects.filter(
        tenant=tenant, code=EventCode.MEMBERSHIP_GRANTED, payload__username="bob"
    ).exists()
