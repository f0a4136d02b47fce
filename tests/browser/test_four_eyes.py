"""Four eyes in Chromium: a refund of 700 waits for two approvers from finance; two
real approver accounts approve on the desk's approvals page, the agent's sponsor
(also in finance) is refused with a clear message, and the agent's retry under the
same key then executes once at the real ticket desk (screenshots in
docs/screenshots/).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from portal.models import Role
from routing.models import Group
from routing.services import group_member_add
from tasks.models import Approval
from tests.api.test_approvals import REFUNDS, publish, retry, with_amount
from tests.browser.conftest import PASSWORD, log_in
from tests.console.test_desk import make_person
from tests.gateway import conftest as gateway_world

pytestmark = pytest.mark.django_db(transaction=True)

ticketdesk_server = gateway_world.ticketdesk_server
desk = gateway_world.desk
world = gateway_world.world

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def approve_in_browser(page, live_server, username: str, shot: str | None = None):
    log_in(page, live_server, username)
    page.goto(f"{live_server.url}/admin/tasks/approval/waiting/")
    page.wait_for_selector("#approvals-waiting")
    if shot:
        page.screenshot(path=str(SHOTS / shot), full_page=True)
    page.click("#approvals-waiting button[value=approve]")
    page.wait_for_selector("ul.messagelist")
    message = page.inner_text("ul.messagelist")
    page.context.clear_cookies()
    return message


def test_two_approvers_approve_and_the_sponsor_is_refused(page, live_server, world):
    publish(world, REFUNDS)
    finance = Group.objects.create(tenant=world.tenant, name="finance")
    people = {
        name: make_person(name, {world.tenant: Role.SUPPORT}, password=PASSWORD)
        for name in ("ana", "ben", "sol")
    }
    for person in people.values():
        group_member_add(tenant=world.tenant, group=finance, user=person)
    world.agent.sponsor = people["sol"]  # sol sponsors the refund agent
    world.agent.save(update_fields=["sponsor"])
    started = world.start_task()
    waiting = world.execute(started, with_amount(world, 700))
    assert waiting.json()["code"] == "APPROVAL_REQUIRED", waiting.text
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1366, "height": 800})

    # The sponsor sees why they cannot decide it, and pressing Approve is refused.
    log_in(page, live_server, "sol")
    page.goto(f"{live_server.url}/admin/tasks/approval/waiting/")
    page.wait_for_selector("#approvals-waiting")
    assert "you sponsor the agent that asked" in page.inner_text(".refusal")
    page.click("#approvals-waiting button[value=approve]")
    page.wait_for_selector("ul.messagelist")
    refused = page.inner_text("ul.messagelist")
    page.screenshot(path=str(SHOTS / "approvals-sponsor-refused.png"), full_page=True)
    assert "Not recorded: you sponsor the agent that asked" in refused
    page.context.clear_cookies()

    first = approve_in_browser(page, live_server, "ana", "approvals-waiting.png")
    assert "the approval is waiting (1 of 2)" in first
    second = approve_in_browser(page, live_server, "ben")
    assert "the approval is approved" in second

    approval = Approval.objects.get(operation_id=started["operation"]["id"])
    assert approval.state == "approved"
    assert sorted(approval.decisions.values_list("person__username", flat=True)) == [
        "ana",
        "ben",
    ]
    done = retry(world, started, 700)
    assert done.json()["outcome"] == "verified", done.text
    assert world.tickets() == 1

    # The task's story shows the approval with both decisions.
    log_in(page, live_server, "ana")
    page.goto(f"{live_server.url}/admin/tasks/task/{started['task']['id']}/change/")
    page.wait_for_selector("tr.approvals")
    story = page.inner_text("tr.approvals")
    page.locator("tr.approvals").screenshot(
        path=str(SHOTS / "approvals-in-the-story.png")
    )
    assert "consumed" in story
    assert "ana: approve" in story and "ben: approve" in story
