"""The admin's front page in Chromium, as the demo reviewer and as staff with no
tenant. (The API docs offline: tests/browser/test_api_docs_offline.py.)"""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.db import connection

from audit.models import Event, EventCode, Outbox, OutboxState
from config.management.commands.seed_demo import seed
from console import site as console_site
from portal.codes import ReasonCode
from portal.db import db_now
from portal.models import Tenant
from tasks.models import TaskState
from tests.browser.conftest import log_in
from tests.browser.shots import docs_shot, report_shot

pytestmark = pytest.mark.django_db(transaction=True)


def add_events(tenant: Tenant, *, per_hour: list[int]) -> None:
    """``per_hour[i]`` events in the clock hour ``i`` hours before the current one."""
    now = db_now()
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    with connection.cursor() as cursor:
        for hours_ago, count in enumerate(per_hour):
            start = this_hour - dt.timedelta(hours=hours_ago)
            for i in range(count):
                at = min(now, start + dt.timedelta(seconds=i * 3600 / max(count, 1)))
                cursor.execute(
                    """
                    INSERT INTO audit_event (id, tenant_id, code, actor_type,
                        actor_id, payload, trace_id, span_id, created_at)
                    VALUES (audit_uuid7_at(%s), %s, %s, 'system', 'browser', '{}',
                        '', '', %s)
                    """,
                    [at, tenant.pk, EventCode.TASK_TRANSITIONED, at],
                )


@pytest.fixture
def demo(make_task, make_tenant) -> Tenant:
    """The demo tenant as ``seed_demo`` makes it, with some work in flight; and a
    second tenant the demo people must never see."""
    seed(report=lambda line: None)
    demo = Tenant.objects.get(slug="demo")
    now = db_now()
    for state, count in (
        (TaskState.PENDING, 4),
        (TaskState.RUNNING, 2),
        (TaskState.WAITING, 1),
        (TaskState.SUCCEEDED, 9),
    ):
        for _ in range(count):
            make_task(tenant=demo, state=state)
    for reason, minutes in (
        (ReasonCode.VERSION_CONFLICT, 95),
        (ReasonCode.FIELD_STALE, 12),
        (ReasonCode.FIELD_STALE, 3),
    ):
        make_task(
            tenant=demo,
            state=TaskState.HUMAN_REQUIRED,
            reason_code=reason,
            updated_at=now - dt.timedelta(minutes=minutes),
        )
    make_task(tenant=demo, state=TaskState.FAILED, reason_code=ReasonCode.STALE_STATE)
    add_events(demo, per_hour=[5, 12, 30, 22, 8, 0, 0, 3, 14, 40, 35, 18, 6])
    hidden = make_tenant(slug="hidden-co")
    for _ in range(50):
        make_task(tenant=hidden, state=TaskState.HUMAN_REQUIRED)
    add_events(hidden, per_hour=[300])
    return demo


def test_the_demo_reviewer_reads_their_dashboard(page, live_server, demo):
    log_in(page, live_server, "reviewer", "reviewer-demo-password")

    dashboard = page.locator("#dashboard")
    dashboard.wait_for()
    takeover = page.inner_text("#dash-takeover").replace("\xa0", " ")
    assert "demo" in takeover and "3" in takeover
    assert "1 hour" in takeover  # the version conflict has waited 95 minutes
    assert page.inner_text("#dash-tasks td[data-state=succeeded]") == "9"
    reasons = page.inner_text("#dash-reasons")
    assert "FIELD_STALE" in reasons and "VERSION_CONFLICT" in reasons
    assert page.locator("#dash-events svg rect.bar").count() == 24
    # seed_demo's own events plus the 193 added here, all within the last 24 hours
    total = Event.objects.filter(tenant=demo).count()
    assert total >= 193
    assert f"{total} in all" in page.inner_text("#dash-events")
    assert page.locator("#dash-outbox").count() == 0  # a reviewer runs no relay
    assert "hidden-co" not in page.content()
    # The app list is still there, under the dashboard.
    assert page.locator("#content-main .app-tasks").count() == 1
    page.set_viewport_size({"width": 1366, "height": 900})
    docs_shot(page, "admin-dashboard-reviewer.png", full_page=True)


def test_the_demo_admin_sees_the_relay_and_retries_a_dead_row(page, live_server, demo):
    dead = Outbox.objects.filter(tenant=demo).order_by("id").first()
    assert dead is not None  # seed_demo's own events went to the outbox
    Outbox.objects.filter(pk=dead.pk).update(
        state=OutboxState.DEAD, attempts=8, last_error="broker unreachable"
    )
    log_in(page, live_server, "admin", "admin-demo-password")

    outbox = page.inner_text("#dash-outbox")
    assert "demo" in outbox and "hidden-co" not in outbox
    page.set_viewport_size({"width": 1366, "height": 900})
    report_shot(page, "admin-dashboard-admin.png", full_page=True)

    page.click("#dash-outbox td.alert a")  # the dead count links to the dead rows
    page.wait_for_selector("#outbox-monitor")
    assert page.inner_text("#outbox-monitor [data-figure=dead]") == "1"
    assert page.locator("#result_list tbody tr").count() == 1
    report_shot(page, "admin-outbox-monitor.png", full_page=True)
    page.check(f"input[name=_selected_action][value='{dead.pk}']")
    page.select_option("select[name=action]", "retry_dead")
    page.click("button[name=index]")

    assert "back in line" in page.inner_text("ul.messagelist")
    dead.refresh_from_db()
    assert dead.state == OutboxState.PENDING and dead.attempts == 8
    (event,) = Event.objects.filter(tenant=demo, code=EventCode.OUTBOX_RETRIED)
    assert event.actor_id == str(User.objects.get(username="admin").pk)


def test_staff_without_a_tenant_is_told_whom_to_ask(page, live_server, demo):
    User.objects.create_user("newcomer", password="pw-browser-tests-2", is_staff=True)

    log_in(page, live_server, "newcomer", "pw-browser-tests-2")

    message = page.inner_text("#no-membership")
    assert "You have no tenant membership yet; ask a tenant administrator" in message
    assert "permission to view or edit anything" not in page.content()
    assert page.locator("#dashboard").count() == 0
    page.set_viewport_size({"width": 1366, "height": 600})
    report_shot(page, "admin-dashboard-no-tenant.png")


def test_the_dashboard_updates_itself_while_it_is_open(
    page, live_server, demo, make_task, monkeypatch
):
    """console/live.js fetches the page again and swaps the dashboard in: tasks
    that finish while a reviewer looks at it show without a reload."""
    monkeypatch.setattr(console_site, "DASHBOARD_REFRESH_S", 2)  # refreshes soon
    log_in(page, live_server, "reviewer", "reviewer-demo-password")
    page.locator("#dashboard").wait_for()
    succeeded = "#dash-tasks td[data-state=succeeded]"
    assert page.inner_text(succeeded) == "9"
    assert page.locator("#dashboard[data-refreshed-at]").count() == 0

    for _ in range(2):
        make_task(tenant=demo, state=TaskState.SUCCEEDED)

    page.wait_for_function(
        "s => document.querySelector(s).innerText.trim() === '11'",
        arg=succeeded,
        timeout=20_000,
    )
    assert page.locator("#dashboard[data-refreshed-at]").count() == 1
    assert page.locator("#dashboard.refresh-failed").count() == 0
    assert "hidden-co" not in page.content()  # the fresh copy is as scoped
