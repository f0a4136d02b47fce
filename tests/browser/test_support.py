"""Support staff at the takeover desk, in Chromium, logged in as themselves.

Never a superuser: two support members of one tenant. One claims from the desk,
reads the evidence and resolves with the receipt id they found; the other's late
claim is refused with a message that names the first.
"""

from __future__ import annotations

import pytest

from audit.models import Event, EventCode
from portal.models import Role
from tasks.models import Operation, OperationState, Task, TaskState
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import report_shot
from tests.console.test_desk import escalate_task, make_person

pytestmark = pytest.mark.django_db(transaction=True)


def test_support_claims_reads_evidence_and_resolves_with_a_receipt(
    browser, page, live_server, tenant, make_task, make_operation
):
    # Given two support members and a task whose call ended with two receipts
    sam = make_person("sam", {tenant: Role.SUPPORT}, password=PASSWORD)
    make_person("kim", {tenant: Role.SUPPORT}, password=PASSWORD)
    task = escalate_task(make_task, make_operation, tenant)
    for n in range(3):  # more rows, so the list looks like a queue
        escalate_task(make_task, make_operation, tenant, n=2000 + n)
    page.set_viewport_size({"width": 1366, "height": 900})

    # and kim has the task's page open before anyone claims it
    kim_context = browser.new_context()
    kim = kim_context.new_page()
    kim.set_default_timeout(15_000)
    log_in(kim, live_server, "kim")
    kim.goto(f"{live_server.url}/admin/console/takeoveritem/{task.pk}/change/")
    assert kim.locator("#desk-claim").count() == 1

    # When sam opens the desk from the admin index
    log_in(page, live_server, "sam")
    page.click("text=Takeover desk")
    page.wait_for_selector("#result_list")
    listing = page.inner_text("#result_list")
    assert "issue-1042" in listing and "customer_issue/1042" in listing
    assert "worker-1" in listing  # responsible owner
    report_shot(page, "desk-list.png", full_page=True)

    # reads the evidence
    page.click("text=issue-1042")
    page.wait_for_selector("#desk-evidence")
    assert "differs from the version read" in page.inner_text("#desk-current-version")
    assert "email" in page.inner_text("#desk-conflicting-fields")
    assert "T-1042-a" in page.inner_text("#desk-receipts")
    assert "ticket-for-issue-1042" in page.inner_text("#desk-plan")
    assert "sk_live_" not in page.content()  # call fields shown redacted

    # and claims it
    page.click("#desk-claim")
    page.wait_for_selector("ul.messagelist")
    assert "You claimed this task" in page.inner_text("ul.messagelist")
    assert "Claimed by sam" in page.inner_text("#desk-status")
    report_shot(page, "desk-evidence.png", full_page=True)

    # Then kim's claim, from the page opened earlier, is refused by name
    kim.click("#desk-claim")
    kim.wait_for_selector("ul.messagelist")
    assert "Someone else claimed this task first: sam." in kim.inner_text(
        "ul.messagelist"
    )
    assert kim.locator("#desk-claim").count() == 0
    report_shot(kim, "desk-refused-claim.png")
    kim_context.close()

    # When sam resolves with the receipt id found at the provider
    operation = Operation.objects.get(task_id=task.pk)
    page.select_option("#desk-resolution", "verify")
    assert page.input_value("#desk-operation") == str(operation.pk)
    page.fill("#desk-reference", "T-1042-a")
    page.fill("#desk-note", "The first ticket is the real one.")
    page.click("#desk-resolve")
    page.wait_for_selector("ul.messagelist")
    assert "Resolved: verify." in page.inner_text("ul.messagelist")

    # Then the timeline (oldest first, as the story shows it) ends with sam's
    # task.resolved, its payload as key/value lines; so does the stored event
    last_row = page.locator("#desk-events tbody tr").last.inner_text()
    assert "task.resolved" in last_row and "sam (person)" in last_row
    assert "resolution\nverify" in last_row or "resolution\tverify" in last_row
    page.locator("#desk-timeline").evaluate("e => e.scrollIntoView()")
    report_shot(page, "desk-resolved.png")
    event = Event.objects.get(task_id=task.pk, code=EventCode.TASK_RESOLVED)
    assert (event.actor_type, event.actor_id) == ("user", str(sam.pk))
    operation.refresh_from_db()
    assert operation.state == OperationState.VERIFIED
    assert operation.provider_reference == "T-1042-a"
    assert Task.objects.get(pk=task.pk).state == TaskState.PENDING
