"""The takeover desk's list as an inbox, in Chromium: support claims a waiting item
and hands another back from the list without opening either, and reassigns a
routed one to a colleague; a tenant admin claims too; a reviewer sees no buttons;
another tenant's member sees no rows."""

from __future__ import annotations

import pytest

from portal.models import Role
from routing.models import Assignment
from tasks.models import Task, TaskState
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot
from tests.console.test_desk import escalate_task, make_person
from tests.routing import conftest as routing_world
from tests.routing.conftest import escalate_with_canary

pytestmark = pytest.mark.django_db(transaction=True)

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
    docs_shot(page, "desk-inbox.png", full_page=True)

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
    # and on Sam's claim no claim, hand back or release: only the reassign
    # choice (an admin works the desk; the item page offers it to her too)
    theirs = _row(admin, second)
    assert theirs.locator(".desk-row-claim, .desk-row-hand-back").count() == 0
    assert theirs.locator(".desk-row-release").count() == 0
    assert theirs.locator("button.desk-row-reassign").count() == 1

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


# routing's groups, rule and webhook receiver (tests/routing/conftest.py)
receiver = routing_world.receiver
desk = routing_world.desk


def test_support_reassigns_from_the_list(
    page, browser, live_server, desk, other_tenant, make_task, make_operation
):
    first, _ = escalate_with_canary(make_task, make_operation, desk.tenant)
    second, _ = escalate_with_canary(make_task, make_operation, desk.tenant)
    ana = desk.members["ana"]
    ana.set_password(PASSWORD)
    ana.save(update_fields=["password"])
    page.set_viewport_size({"width": 1500, "height": 560})
    log_in(page, live_server, "ana")
    page.goto(f"{live_server.url}{DESK}")

    # Each routed row offers the tenant's groups and desk people, Billing marked
    choice = _row(page, first).locator("select.desk-row-to")
    assert choice.locator("option").all_inner_texts() == [
        "Billing (has it now)",
        "Billing → ana",
        "Billing → bo",
        "On-call",
        "On-call → cy",
    ]
    # When Ana moves the first to Cy (On-call) from the list
    choice.select_option(label="On-call → cy")
    docs_shot(page, "desk-inbox-reassign.png")
    _row(page, first).locator("button.desk-row-reassign").click()
    page.wait_for_selector("ul.messagelist")
    # Then she is still on the list, told which task moved, and the row says so
    assert f"{first.client_task_id}: Moved" in page.inner_text("ul.messagelist")
    assert page.url.startswith(f"{live_server.url}{DESK}")
    assert "On-call" in _row(page, first).inner_text()
    moved = _row(page, first).locator("select.desk-row-to option[selected]")
    assert moved.inner_text() == "On-call → cy (has it now)"
    item = Assignment.objects.get(tenant=desk.tenant, task_id=first.pk)
    assert (item.group_id, item.person_id) == (desk.backup.pk, desk.members["cy"].pk)
    assert Assignment.objects.get(task_id=second.pk).group_id == desk.group.pk

    # A reviewer sees the rows and no choice
    make_person("rita", {desk.tenant: Role.REVIEWER}, password=PASSWORD)
    reviewer = browser.new_context().new_page()
    log_in(reviewer, live_server, "rita")
    reviewer.goto(f"{live_server.url}{DESK}")
    assert _row(reviewer, second).count() == 1
    assert reviewer.locator("select.desk-row-to").count() == 0

    # Another tenant's member sees none of these rows
    make_person("olga", {other_tenant: Role.ADMIN}, password=PASSWORD)
    outsider = browser.new_context().new_page()
    log_in(outsider, live_server, "olga")
    outsider.goto(f"{live_server.url}{DESK}")
    assert first.client_task_id not in outsider.content()
    assert outsider.locator("select.desk-row-to").count() == 0
