"""Support fixes a stale field at the desk, in Chromium, against the real ticket desk.

Never a superuser: a support member of the tenant claims a task the gateway refused
``FIELD_STALE``, types the fresh e-mail into the edit form (source and read time
come prefilled from the pinned contract) and executes; the ticket desk makes one
ticket and the page says which.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest

from audit.models import Event, EventCode
from portal.db import db_now
from portal.models import Role
from tasks.models import Operation, OperationState, Task, TaskState
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot, report_shot
from tests.console.test_desk import make_person
from tests.gateway import conftest as gateway_world
from tests.gateway.conftest import World, minutes_ago

pytestmark = pytest.mark.django_db(transaction=True)


# The gateway tests' world, fixtures by name.
world = gateway_world.world


def test_support_edits_a_stale_field_and_the_desk_makes_one_ticket(
    page, live_server, world: World
):
    # Given the gateway refused the agent's 10-minute-old e-mail
    started = world.start_task()
    refused = world.execute(
        started, world.fields(email={"observed_at": minutes_ago(10)})
    )
    assert refused.json()["code"] == "FIELD_STALE", refused.text
    task_id = started["task"]["id"]
    sam = make_person("sam", {world.tenant: Role.SUPPORT}, password=PASSWORD)
    assert not sam.is_superuser
    page.set_viewport_size({"width": 1366, "height": 900})

    # When sam opens the task from the desk and claims it
    log_in(page, live_server, "sam")
    page.click("text=Takeover desk")
    page.wait_for_selector("#result_list")
    page.click("text=issue-1042")
    page.wait_for_selector("#desk-evidence")
    assert "FIELD_STALE" in page.inner_text("#desk-conflicting-fields")
    page.click("#desk-claim")
    page.wait_for_selector("ul.messagelist")

    # the edit form has the contract's fields: the stale e-mail asked and why, the
    # plan the agent read kept (it still passes); approve is not offered
    form = page.locator("#desk-edit-form")
    assert form.locator("tr[data-field]").count() == 2
    assert form.locator("tr.desk-asked").get_attribute("data-field") == "email"
    assert form.locator("tr.desk-kept").get_attribute("data-field") == "plan"
    asked = page.inner_text("#desk-edit-0-why")
    assert re.search(
        r"Asked — the fields check refused it \(FIELD_STALE\): email was read "
        r"10 min before the check; the contract allows 5 min; read \[email:hm_\w+\] "
        r"from crm at ",
        asked,
    ), asked
    assert "Kept — pro from billing" in page.inner_text("#desk-edit-1-why")
    assert page.get_attribute("#desk-edit-1-value", "placeholder") == "keep pro"
    assert page.input_value("#desk-edit-0-source") == "crm"
    assert page.input_value("#desk-edit-1-source") == "billing"
    assert "read at most 5 min before the check" in form.inner_text()
    assert page.input_value("#desk-edit-0-observed-at")  # now, prefilled
    options = page.locator("#desk-resolution option").all_inner_texts()
    assert "Approve as is" not in options
    assert "Hand back for a fresh read" in options

    # When sam first types a read time of a quarter of an hour ago (the plan kept)
    quarter_ago = db_now().astimezone(dt.UTC) - dt.timedelta(minutes=15)
    page.fill("#desk-edit-0-value", "ana.new@example.com")
    page.fill("#desk-edit-0-observed-at", quarter_ago.strftime("%Y-%m-%dT%H:%M:%S"))
    page.click("#desk-edit-submit")
    page.wait_for_selector("ul.messagelist li.error")

    # Then the gateway refuses it again, says why, and the task stays with sam
    assert (
        "The gateway refused it again: FIELD_STALE — email was read 15 min before "
        "the check; the contract allows 5 min; the task stays with you."
    ) in page.inner_text("ul.messagelist")
    assert world.tickets() == 0
    assert "Claimed by sam" in page.inner_text("#desk-status")
    report_shot(page, "desk-edit-refused.png")
    # the README's desk picture: the refusal said, e-mail asked, plan kept
    page.locator("#desk-edit").scroll_into_view_if_needed()
    docs_shot(page, "desk-edit.png")

    # When sam gives the e-mail read in the CRM just now, the plan still kept
    assert page.get_attribute("#desk-edit-1-value", "placeholder") == ("keep pro")
    assert "15 min before the check" in page.inner_text("#desk-edit-0-why")
    page.fill("#desk-edit-0-value", "ana.new@example.com")
    page.fill("#desk-edit-note", "Called Ana; the CRM has her new address.")
    page.locator("#desk-edit").scroll_into_view_if_needed()
    report_shot(page, "desk-edit-form.png")
    docs_shot(page.locator("#desk-edit"), "desk-edit-form.png")
    page.click("#desk-edit-submit")
    page.wait_for_selector("ul.messagelist li.success")

    # Then the desk made one ticket and the message names it
    message = page.inner_text("ul.messagelist")
    found = re.search(r"Executed: ticket (\S+) verified; the task went back", message)
    assert found, message
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert operation.state == OperationState.VERIFIED
    assert found.group(1) == operation.provider_reference
    assert world.tickets() == 1
    assert Task.objects.get(pk=task_id).state == TaskState.PENDING
    edits = Event.objects.filter(
        task_id=task_id, code=EventCode.OPERATION_FIELDS_EDITED
    ).values_list("actor_type", "actor_id")
    assert list(edits) == [("user", str(sam.pk))] * 2  # the refused one and this
    # the events read oldest first as on the story, sam's resolution last
    last_row = page.locator("#desk-events tbody tr").last.inner_text()
    assert "task.resolved" in last_row and "sam (person)" in last_row
    assert "edited_and_executed" in last_row
    codes = page.locator(
        "#desk-events tbody tr td:nth-child(4) strong"
    ).all_inner_texts()
    assert codes[0] == "task.registered", codes
    assert (
        "settled: Edited the fields and executed (edited_and_executed) by sam"
    ) in page.inner_text("#desk-evidence-settled")
    report_shot(page, "desk-edit-done.png")
    report_shot(page.locator("#desk-timeline"), "desk-edit-timeline.png")
    report_shot(
        page.locator("#desk-events tbody tr").last, "desk-edit-timeline-last.png"
    )
