"""The task's timeline in Chromium (issue 24 §2, after Temporal's history view): one
row per step, a check pass folded into one row, the time between steps, how long
the task waited on the desk and how long a person held it, refreshed while the task
is live. Read as each role that sees the task (reviewer, support, tenant admin) on
the story page and at the desk; another tenant's member finds nothing."""

from __future__ import annotations

import pytest
from django.db import transaction

from audit import services as audit_services
from audit.models import EventCode
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.models import Role
from tasks.escalation import escalate
from tasks.models import OperationState, Task, TaskState
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot
from tests.console.test_desk import make_person

pytestmark = pytest.mark.django_db(transaction=True)

CHECKS = "contract ✓, fields ✓, target ✓, permission ✓, version ✗"


def _refused_task(make_task, make_operation, tenant, agent) -> Task:
    """A running task whose execute was refused by the version fence: one check
    pass (four passed, the fence refused) and the hand-over to the desk."""
    task = make_task(
        tenant=tenant,
        state=TaskState.RUNNING,
        leased=True,
        client_task_id="issue-1042",
        object_id="1042",
        object_version="7",
    )
    operation = make_operation(
        task=task,
        state=OperationState.RESERVED,
        idempotency_key="ticket-for-issue-1042",
        input={"queue": "billing", "summary": "Refund for issue 1042"},
    )
    evidence = {"version_read": "7", "current_version": "9"}
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.GATEWAY_CHECKED,
            actor=Actor.of_agent(agent),
            task_id=task.pk,
            operation_id=operation.pk,
            reason="VERSION_CONFLICT",
            data={
                "verdict": "refused",
                "check": "version",
                "checks": [
                    {"check": "contract", "verdict": "passed"},
                    {"check": "fields", "verdict": "passed", "fields": ["email"]},
                    {"check": "target", "verdict": "passed"},
                    {"check": "permission", "verdict": "passed"},
                    {"check": "version", "verdict": "refused", **evidence},
                ],
            },
            publish=False,
        )
        escalate(
            tenant=tenant,
            task=task,
            operation=operation,
            reason=ReasonCode.VERSION_CONFLICT,
            evidence=evidence,
            actor=Actor.of_agent(agent),
        )
    return Task.objects.get(pk=task.pk)


def _wait_for_text(page, selector: str, text: str) -> None:
    page.wait_for_function(
        "([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)",
        arg=[selector, text],
        timeout=20_000,
    )


def test_the_timeline_folds_checks_says_the_wait_and_refreshes_while_live(
    browser, page, live_server, tenant, agent, make_task, make_operation
):
    # Given a task refused by the version fence, on the desk
    task = _refused_task(make_task, make_operation, tenant, agent)
    make_person("rita", {tenant: Role.REVIEWER}, password=PASSWORD)
    make_person("sam", {tenant: Role.SUPPORT}, password=PASSWORD)
    make_person("ada", {tenant: Role.ADMIN}, password=PASSWORD)
    story_url = f"{live_server.url}/admin/tasks/task/{task.pk}/change/"
    desk_url = f"{live_server.url}/admin/console/takeoveritem/{task.pk}/change/"
    page.set_viewport_size({"width": 1366, "height": 900})

    # When the reviewer opens the task's story
    log_in(page, live_server, "rita")
    page.goto(story_url)
    page.wait_for_selector("#story-events[data-live]")
    rows = page.locator("#story-events tbody tr")
    # Then the check pass is one row, with every verdict and the fence's evidence
    codes = page.locator("#story-events tbody tr td:nth-child(4) strong")
    assert codes.all_inner_texts()[0] == "gateway.checked"
    assert "task.escalated" in codes.all_inner_texts()
    checked = rows.first.inner_text()
    assert CHECKS in checked and "VERSION_CONFLICT" in checked
    assert "version.current_version" in checked
    # each later step says how long after the one before it came
    assert all(
        after.startswith("+")
        for after in page.locator("#story-events td.after").all_inner_texts()[1:]
    )

    # When support claims it at the desk (another browser, another person)
    sam_context = browser.new_context()
    sam = sam_context.new_page()
    sam.set_default_timeout(15_000)
    log_in(sam, live_server, "sam")
    sam.goto(desk_url)
    sam.click("#desk-claim")
    sam.wait_for_selector("ul.messagelist")
    # Then the desk's events read as the story's (one rendering, oldest first)
    desk_codes = sam.locator("#desk-events tbody tr td:nth-child(4) strong")
    assert desk_codes.all_inner_texts()[0] == "gateway.checked"
    assert desk_codes.all_inner_texts()[-1] == "task.human_claimed"
    assert CHECKS in sam.locator("#desk-events tbody tr").first.inner_text()
    assert "on the desk" in sam.locator("#desk-events tbody tr").last.inner_text()

    # and the reviewer's open page shows the claim without a reload
    _wait_for_text(page, "#story-events", "task.human_claimed")
    claimed = page.locator("#story-events tbody tr").last.inner_text()
    assert (
        "waited" in claimed and "on the desk" in claimed and "sam (person)" in claimed
    )

    # When sam hands it back, the reviewer's page says how long sam held it
    sam.click("#desk-release")
    sam.wait_for_selector("ul.messagelist")
    _wait_for_text(page, "#story-events", "held ")
    released = page.locator("#story-events tbody tr").last.inner_text()
    assert "task.human_released" in released and "by sam (person)" in released
    steps = page.locator("#story-events tbody tr").count()
    assert page.inner_text("#story-events-count").startswith(f"({steps} steps")
    page.locator("#timeline").scroll_into_view_if_needed()
    docs_shot(page.locator(".story").first, "task-timeline.png")
    sam_context.close()

    # And the tenant's administrator reads the same timeline
    admin_context = browser.new_context()
    ada = admin_context.new_page()
    ada.set_default_timeout(15_000)
    log_in(ada, live_server, "ada")
    ada.goto(story_url)
    ada.wait_for_selector("#story-events")
    text = ada.inner_text("#story-events")
    assert CHECKS in text and "held " in text
    admin_context.close()


def test_another_tenants_member_finds_neither_the_story_nor_the_desk_item(
    page, live_server, tenant, other_tenant, agent, make_task, make_operation
):
    task = _refused_task(make_task, make_operation, tenant, agent)
    make_person("bea", {other_tenant: Role.ADMIN}, password=PASSWORD)
    log_in(page, live_server, "bea")
    for url in (
        f"/admin/tasks/task/{task.pk}/change/",
        f"/admin/console/takeoveritem/{task.pk}/change/",
    ):
        # the admin's "not found": a redirect to the index, nothing of the task
        answer = page.request.get(f"{live_server.url}{url}", max_redirects=0)
        assert answer.status == 302, (url, answer.status)
        page.goto(f"{live_server.url}{url}")
        assert page.url == f"{live_server.url}/admin/", url
        assert "issue-1042" not in page.content() and CHECKS not in page.content()
