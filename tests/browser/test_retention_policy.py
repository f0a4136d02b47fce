"""A tenant administrator sets the tenant's retention policy in Chromium, and the
change is in the trail under her name; the tenant's reviewer then reads it and has
nothing to save."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from audit.models import Event, RetentionPolicy
from portal import services as portal_services
from portal.models import Role
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import report_shot

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_tenant_admin_sets_the_retention_policy_and_a_reviewer_reads_it(
    page, live_server, tenant, browser
):
    ada = User.objects.create_user("ada", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=ada, role=Role.ADMIN)
    rex = User.objects.create_user("rex", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=rex, role=Role.REVIEWER)
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, live_server, "ada")

    # When she adds the policy from the form, which starts from the defaults
    page.goto(f"{live_server.url}/admin/audit/retentionpolicy/add/")
    assert page.input_value("input[name=event_months]") == "24"
    page.select_option("select[name=tenant]", str(tenant.pk))
    page.fill("input[name=event_months]", "12")
    page.fill("input[name=payload_days]", "90")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist")
    report_shot(page, "retention-policy-admin.png", full_page=True)

    # Then the list shows it and the trail names her
    assert "12" in page.inner_text("#result_list")
    policy = RetentionPolicy.objects.get(tenant=tenant)
    assert (policy.event_months, policy.payload_days) == (12, 90)
    [event] = Event.objects.filter(
        tenant=tenant, code="tenant.changed", actor_type="user", actor_id=str(ada.pk)
    )
    assert event.payload["retention_policy"]["event_months"] == [24, 12]

    # And the reviewer reads it with nothing to save
    reviewer = browser.new_page()
    log_in(reviewer, live_server, "rex")
    reviewer.goto(f"{live_server.url}/admin/audit/retentionpolicy/{policy.pk}/change/")
    text = reviewer.inner_text("#content")
    assert "12" in text and "90" in text
    assert reviewer.locator("input[name=_save]").count() == 0
    assert reviewer.locator("input[name=event_months]").count() == 0
    report_shot(reviewer, "retention-policy-reviewer.png", full_page=True)
    reviewer.close()
