"""The event browser as an event history, in Chromium: a reviewer narrows it with
the code filter (entries read as the codes) and the browser's date and time
pickers, reads each task's client id beside its short id, saves the search and
opens it again; another tenant's administrator sees none of it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from console.models import SavedSearch
from portal import services as portal_services
from portal.models import Role
from tests.browser.conftest import log_in
from tests.browser.shots import docs_shot
from tests.browser.test_reviewer import PASSWORD, log_in_as_reviewer, story  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_reviewer_filters_by_code_and_time_and_saves_the_search(
    page,
    live_server,
    tenant,
    story,  # noqa: F811
):
    page.set_viewport_size({"width": 1366, "height": 900})
    rita = log_in_as_reviewer(page, live_server, tenant)
    page.goto(f"{live_server.url}/admin/audit/event/")
    # The code filter's entries are the codes the list shows
    codes = page.locator("details[data-filter-title='code'] a")
    assert "task.human_claimed" in codes.all_inner_texts()
    assert "Task Human Claimed" not in page.inner_text("#changelist-filter")
    page.click("details[data-filter-title='code'] a:text-is('task.human_claimed')")
    page.wait_for_url("**code__exact=task.human_claimed**")
    # The time range: the browser's own pickers
    assert page.get_attribute("#filter-created_from", "type") == "datetime-local"
    page.fill("#filter-created_from", "2000-01-01T00:00")
    page.fill("#filter-created_to", "2999-12-31T23:59")
    page.locator("#filter-created_to").press("Enter")
    page.wait_for_url("**created_from=2000-01-01T00%3A00**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    # The task's client id beside its short id
    assert story.client_task_id in rows.first.inner_text()

    # When she saves it
    page.fill("#save-search-name", "claims since 2000")
    page.click("#save-search button[type=submit]")
    page.wait_for_selector("#saved-searches a[aria-current=true]")
    assert "Saved as “claims since 2000”" in page.inner_text("ul.messagelist")
    docs_shot(page, "event-history.png", full_page=True)
    # and opens it again from the plain list
    page.goto(f"{live_server.url}/admin/audit/event/")
    assert page.locator("#result_list tbody tr").count() == 4
    page.click("#saved-searches a:text-is('claims since 2000')")
    page.wait_for_selector("#saved-searches a[aria-current=true]")
    assert page.locator("#result_list tbody tr").count() == 1
    assert page.input_value("#filter-created_from") == "2000-01-01T00:00"
    assert SavedSearch.objects.filter(user=rita).count() == 1


def test_another_tenants_admin_sees_neither_the_rows_nor_the_saved_search(
    page,
    live_server,
    tenant,
    other_tenant,
    story,  # noqa: F811
):
    rita = User.objects.create_user("rita", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=rita, role=Role.REVIEWER)
    saved = SavedSearch.objects.create(
        user=rita, name="rita's", query=f"tenant={tenant.pk}"
    )
    olga = User.objects.create_user("olga", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=other_tenant, user=olga, role=Role.ADMIN)
    log_in(page, live_server, "olga", PASSWORD)
    page.goto(f"{live_server.url}/admin/audit/event/?{saved.query}")
    assert page.locator("#result_list tbody tr").count() == 0
    assert "rita's" not in page.inner_text("#saved-searches")
    assert story.client_task_id not in page.content()
