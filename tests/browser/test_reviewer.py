"""A compliance reviewer (not a superuser) reads a task's story and exports it."""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from audit import services as audit_services
from audit.models import Event, EventCode
from portal import services as portal_services
from portal.actors import Actor
from portal.models import Role
from portal.tracing import Trace
from tasks.models import Credential, Escalation, OperationState, Task, TaskState
from tests.browser.conftest import log_in
from tests.browser.shots import docs_shot, report_shot

pytestmark = pytest.mark.django_db(transaction=True)

TRACE = "5c4e1a7b9d2f4e6a8b0c1d2e3f4a5b6c"
HUMAN_TRACE = "9" * 32
SECRET = "agp_0123456789ab.x"
PASSWORD = "pw-reviewer-browser-1"


@pytest.fixture
def story(tenant, agent, make_task, make_operation, settings):
    """A task with agent and human events, an operation, a credential, an escalation."""
    settings.PORTAL_TRACE_URL_TEMPLATE = "http://localhost:16686/trace/{trace_id}"
    support = User.objects.create_user("sam", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=support, role=Role.SUPPORT)
    task = make_task(
        state=TaskState.RUNNING, leased=True, trace_id=TRACE, object_id="ISSUE-1042"
    )
    operation = make_operation(
        task=task, state=OperationState.EXECUTING, idempotency_key="create:ISSUE-1042"
    )
    Credential.objects.create(
        tenant=tenant,
        operation=operation,
        object_type="customer_issue",
        object_id="ISSUE-1042",
        fields=["status", "priority"],
        action="create_ticket",
        target="ticket-desk",
        secret_hash="e" * 64,
        expires_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC),
    )
    Escalation.objects.create(
        tenant=tenant,
        task=task,
        operation=operation,
        reason_code="VERSION_CONFLICT",
        evidence={"current_version": "8", "read_version": "7"},
        responsible_owner="desk-team",
    )
    with transaction.atomic():
        for code, actor, trace, data in (
            (
                EventCode.TASK_REGISTERED,
                Actor.of_agent(agent),
                TRACE,
                {"api_key": SECRET},
            ),
            (
                EventCode.OPERATION_RESERVED,
                Actor.of_agent(agent),
                TRACE,
                {"key": "create:ISSUE-1042", "note": f"token is {SECRET}"},
            ),
            (EventCode.TASK_ESCALATED, Actor.system("gateway"), TRACE, {"to": "human"}),
            (
                EventCode.TASK_HUMAN_CLAIMED,
                Actor.of_user(support),
                HUMAN_TRACE,
                {"lease_token": 2},
            ),
        ):
            audit_services.event_append(
                tenant_id=tenant.pk,
                task_id=task.pk,
                operation_id=operation.pk if code.startswith("operation") else None,
                code=code,
                actor=actor,
                reason="VERSION_CONFLICT" if code == EventCode.TASK_ESCALATED else None,
                contract=("customer-issue", 2),
                data=data,
                trace=Trace(trace_id=trace, span_id="a1b2c3d4e5f60718"),
            )
    return task


def log_in_as_reviewer(page, live_server, tenant) -> User:
    reviewer = User.objects.create_user("rita", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=reviewer, role=Role.REVIEWER)
    assert not reviewer.is_superuser
    log_in(page, live_server, "rita", PASSWORD)
    return reviewer


def test_a_reviewer_finds_a_task_by_trace_reads_its_story_and_exports_it(
    page, live_server, tenant, agent, story
):
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in_as_reviewer(page, live_server, tenant)
    # finds the task by its trace id
    page.goto(f"{live_server.url}/admin/tasks/task/")
    page.fill("#searchbar", TRACE)
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 1
    page.click(f"#result_list a[href*='/tasks/task/{story.pk}/change/']")
    page.wait_for_selector("#story-events")
    # reads the timeline: names, milliseconds, readable redacted payloads, links
    timeline = page.inner_text("#story-events")
    assert f"{agent.name} (agent)" in timeline and "sam (person)" in timeline
    assert "gateway (system)" in timeline
    assert "task.human_claimed" in timeline and "customer-issue v2" in timeline
    assert "api_key" in timeline and "[REDACTED]" in timeline
    assert SECRET not in page.content() and "agp_0123456789ab" not in page.content()
    trace_link = page.locator(f"#story-events a[href*='/trace/{TRACE}']").first
    assert trace_link.get_attribute("href") == f"http://localhost:16686/trace/{TRACE}"
    assert "create:ISSUE-1042" in page.inner_text("#story-operations")
    assert "e" * 64 not in page.content()  # the credential's secret hash
    assert "desk-team" in page.inner_text("#story-escalations")
    assert "worker-1" in page.inner_text("#story-lease")
    docs_shot(page, "reviewer-task-story.png", full_page=True)
    # cannot change anything: no save or delete, and a POST is refused
    assert page.locator("input[name=_save]").count() == 0
    assert page.locator("a.deletelink").count() == 0
    response = page.request.post(
        f"{live_server.url}/admin/tasks/task/{story.pk}/change/",
        form={"state": "cancelled"},
        headers={"X-CSRFToken": _csrf(page), "Referer": page.url},
    )
    assert response.status == 403
    assert Task.objects.get(pk=story.pk).state == TaskState.RUNNING
    # the event browser finds the human claim (other trace) by the task's trace id
    page.click("#story-events a.story-all, a.story-all")
    page.wait_for_selector("#result_list")
    page.goto(f"{live_server.url}/admin/audit/event/?q={TRACE}")
    listed = page.inner_text("#result_list")
    assert "task.human_claimed" in listed and "sam (person)" in listed
    assert page.locator("#result_list tbody tr").count() == 4
    docs_shot(page, "reviewer-event-list.png", full_page=True)
    # exports the selection as CSV; the file is the four events, redacted
    with page.expect_download() as download_info:
        page.click("#export-csv")
    download = download_info.value
    rows = list(csv.DictReader(io.StringIO(Path(download.path()).read_text())))
    assert len(rows) == 4
    assert {row["task_id"] for row in rows} == {str(story.pk)}
    assert "task.human_claimed" in {row["code"] for row in rows}
    assert all(SECRET not in row["payload"] for row in rows)
    exported = Event.objects.get(code=EventCode.AUDIT_EXPORTED)
    assert exported.payload["rows"] == 4 and exported.payload["filters"] == {"q": TRACE}


def _csrf(page) -> str:
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    return cookies["csrftoken"]


def test_the_task_list_fits_its_box_at_1400_px(page, live_server, tenant, make_task):
    """Issue 23: at 1,400 px the task list scrolled sideways, its trace column out of
    view; every column now fits the list's box."""
    # Given tasks as the scale data set writes them: long client and object ids, an
    # agent's worker as lease owner, the longest reason code, a trace on each
    for n in range(3):
        make_task(
            state=TaskState.RUNNING if n else TaskState.FAILED,
            leased=bool(n),
            client_task_id=f"scale-{n:08d}",
            object_id=f"ISSUE-{n:08d}",
            object_version="17",
            reason_code=None if n else "IDEMPOTENCY_KEY_REUSED",
            trace_id=f"{n}" * 32,
        )
    Task.objects.filter(tenant=tenant, lease_owner__isnull=False).update(
        lease_owner="scale-agent-1/worker-3"
    )
    page.set_viewport_size({"width": 1400, "height": 900})
    log_in_as_reviewer(page, live_server, tenant)
    # When the reviewer opens the task list
    page.goto(f"{live_server.url}/admin/tasks/task/")
    page.wait_for_selector("#result_list td.field-trace")
    # Then the table fits its box and the page does not scroll sideways
    fit = page.evaluate(
        """() => ({
            table: document.querySelector('#result_list').scrollWidth,
            box: document.querySelector('#changelist .results').clientWidth,
            page: document.documentElement.scrollWidth,
            view: window.innerWidth,
            trace: Math.max(...[...document.querySelectorAll(
                '#result_list td.field-trace')].map(td => td.getBoundingClientRect().right)),
            right: document.querySelector('#changelist .results')
                .getBoundingClientRect().right,
        })"""
    )
    report_shot(page, "task-list-1400.png", full_page=True)
    assert fit["table"] <= fit["box"], fit
    assert fit["page"] <= fit["view"], fit
    assert fit["trace"] <= fit["right"], fit
    assert "00000000" in page.inner_text("#result_list")
