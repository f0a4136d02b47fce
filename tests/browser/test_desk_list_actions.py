"""The takeover desk's list as an inbox, in Chromium: support claims a waiting item
and hands another back from the list without opening either; a tenant admin
claims too; a reviewer sees no buttons; another tenant's member sees no rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from portal.models import Role
from tasks.models import Task, TaskState
from tests.browser.conftest import PASSWORD, log_in
from tests.console.test_desk import escalate_task, make_person

pytestmark = pytest.mark.django_db(transaction=True)

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
DESK = "/admin/console/takeoveritem/"


def _row(page, task: Task):
    return page.locator("#result_list tbody tr", has_text=task.client_task_id)


def test_support_works_the_desk_from_the_list(
    page, browser, live_server, tenant, other_tenant, make_task, make_operation
):
    first = escalate_task(make_task, make_operation, tenant, n=1042)
    second = escalate_task(make_task, make_operation, tenant, n=1043)
    third = escalate_task(make_task, make_operation, tenant, n=1044)
    make_person("sam", {tenant: Role.SUPPORT}, password=PASSWORD)
    page.set_viewport_size({"width": 1366, "height": 700})
    log_in(page, live_server, "sam")
    page.goto(f"{live_server.url}{DESK}")

    # When Sam claims two items from the list
    _row(page, first).locator("button.desk-row-claim").click()
    page.wait_for_selector("ul.messagelist")
    assert "issue-1042: You claimed this task" in page.inner_text("ul.messagelist")
    assert page.url.startswith(f"{live_server.url}{DESK}")  # still the list
    _row(page, second).locator("button.desk-row-claim").click()
    page.wait_for_selector("ul.messagelist")
    # Then his rows offer hand back and release; the waiting one still a claim
    assert _row(page, first).locator("button.desk-row-hand-back").count() == 1
    assert _row(page, third).locator("button.desk-row-claim").count() == 1
    page.screenshot(path=str(SHOTS / "desk-inbox.png"), full_page=True)

    # When he hands one back with a note, from the list
    row = _row(page, first)
    row.locator("input[name=note]").fill("the customer wrote again: re-read")
    row.locator("button.desk-row-hand-back").click()
    page.wait_for_selector("ul.messagelist")
    assert "issue-1042: Resolved: hand back." in page.inner_text("ul.messagelist")
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == TaskState.PENDING
    assert second.state == TaskState.HUMAN_CLAIMED

    # A tenant admin may claim from the list too
    make_person("ada", {tenant: Role.ADMIN}, password=PASSWORD)
    admin = browser.new_context().new_page()
    log_in(admin, live_server, "ada")
    admin.goto(f"{live_server.url}{DESK}")
    _row(admin, third).locator("button.desk-row-claim").click()
    admin.wait_for_selector("ul.messagelist")
    third.refresh_from_db()
    assert third.state == TaskState.HUMAN_CLAIMED
    # and sees no button on Sam's claim
    assert _row(admin, second).locator(".desk-row-act").count() == 0

    # A reviewer sees the rows and no button
    make_person("rita", {tenant: Role.REVIEWER}, password=PASSWORD)
    reviewer = browser.new_context().new_page()
    log_in(reviewer, live_server, "rita")
    reviewer.goto(f"{live_server.url}{DESK}")
    assert reviewer.locator("#result_list tbody tr").count() >= 2
    assert reviewer.locator(".desk-row-act").count() == 0

    # Another tenant's member sees none of these rows
    make_person("olga", {other_tenant: Role.ADMIN}, password=PASSWORD)
    outsider = browser.new_context().new_page()
    log_in(outsider, live_server, "olga")
    outsider.goto(f"{live_server.url}{DESK}")
    assert "issue-104" not in outsider.content()
