"""The dashboard on the admin's front page: figures per role and per tenant."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import EventCode, OutboxState
from console import dashboard
from portal.codes import ReasonCode
from portal.db import db_now
from tasks.models import TaskState

from .ops_people import logged_in, person
from .test_ops_outbox import make_row

INDEX = "/admin/"
DAY = dt.timedelta(days=1)


def add_event(tenant, *, at: dt.datetime) -> None:
    """An event written at ``at`` (events are append-only; INSERT sets the time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO audit_event (id, tenant_id, code, actor_type, actor_id,
                payload, trace_id, span_id, created_at)
            VALUES (audit_uuid7_at(%s), %s, %s, 'system', 'ops-tests', '{}', '', '', %s)
            """,
            [at, tenant.pk, EventCode.TASK_REGISTERED, at],
        )


@pytest.fixture
def tasks_of_a(tenant, make_task):
    """Tenant A: open tasks in every open state, and finished ones old and new."""
    now = db_now()
    for _ in range(2):
        make_task(state=TaskState.PENDING)
    make_task(state=TaskState.RUNNING)
    for reason, age in (
        (ReasonCode.VERSION_CONFLICT, 3600),
        (ReasonCode.VERSION_CONFLICT, 60),
        (ReasonCode.FIELD_STALE, 120),
    ):
        make_task(
            state=TaskState.HUMAN_REQUIRED,
            reason_code=reason,
            updated_at=now - dt.timedelta(seconds=age),
        )
    make_task(state=TaskState.HUMAN_CLAIMED, reason_code=ReasonCode.FIELD_STALE)
    make_task(state=TaskState.SUCCEEDED, updated_at=now - dt.timedelta(hours=1))
    make_task(state=TaskState.SUCCEEDED, updated_at=now - dt.timedelta(hours=2))
    make_task(state=TaskState.SUCCEEDED, updated_at=now - 2 * DAY)  # not counted
    make_task(
        state=TaskState.FAILED,
        reason_code=ReasonCode.MULTIPLE_RECEIPTS,
        updated_at=now - dt.timedelta(hours=3),
    )
    make_task(
        state=TaskState.FAILED,
        reason_code=ReasonCode.STALE_STATE,
        updated_at=now - 3 * DAY,  # not counted: finished long ago
    )
    return now


@pytest.fixture
def tasks_of_b(other_tenant, make_task):
    for _ in range(7):
        make_task(tenant=other_tenant, state=TaskState.HUMAN_REQUIRED)
    make_task(tenant=other_tenant, state=TaskState.SUCCEEDED)


def state_counts(figures: dashboard.TenantTasks) -> dict[str, int]:
    return {state: count.value for state, count in figures.states}


@pytest.mark.django_db
def test_task_figures_count_open_tasks_and_the_last_day_of_finished_ones(
    tenant, other_tenant, tasks_of_a, tasks_of_b
):
    (a,) = dashboard.task_figures(tenants=[tenant])

    assert state_counts(a) == {
        "pending": 2,
        "running": 1,
        "waiting": 0,
        "human_required": 3,
        "human_claimed": 1,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 0,
    }
    assert (a.takeover_waiting.value, a.takeover_claimed.value) == (3, 1)
    # the longest-waiting task entered the queue an hour ago
    assert a.takeover_oldest_at is not None
    assert (tasks_of_a - a.takeover_oldest_at).total_seconds() == pytest.approx(3600)
    assert dict(a.reasons) == {
        ReasonCode.VERSION_CONFLICT: 2,
        ReasonCode.FIELD_STALE: 2,
        ReasonCode.MULTIPLE_RECEIPTS: 1,
    }


@pytest.mark.django_db
def test_a_count_stops_at_the_cap(tenant, make_task, monkeypatch):
    monkeypatch.setattr(dashboard, "COUNT_CAP", 2)
    for _ in range(3):
        make_task(state=TaskState.PENDING)
    make_task(state=TaskState.RUNNING)

    (a,) = dashboard.task_figures(tenants=[tenant])

    assert str(a.by_state["pending"]) == "2+" and a.by_state["pending"].capped
    assert str(a.by_state["running"]) == "1"


@pytest.mark.django_db
def test_events_per_hour_fill_24_clock_hours(tenant, other_tenant):
    now = db_now()
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    for at in (now, now, this_hour - dt.timedelta(minutes=30)):
        add_event(tenant, at=at)
    add_event(tenant, at=this_hour - dt.timedelta(hours=23, minutes=1))  # too old
    add_event(other_tenant, at=now)  # another tenant's

    buckets = dashboard.events_per_hour(tenants=[tenant])

    assert len(buckets) == 24
    assert buckets[-1] == (this_hour, 2)
    assert buckets[-2] == (this_hour - dt.timedelta(hours=1), 1)
    assert sum(n for _, n in buckets) == 3
    svg = dashboard.events_chart_svg(buckets)
    assert svg.startswith("<svg") and svg.count('<rect class="bar"') == 24
    assert "2 events" in svg and "http" not in svg.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )


@pytest.mark.django_db
def test_a_reviewer_sees_tasks_and_events_of_their_tenant_and_no_outbox(
    tenant, other_tenant, tasks_of_a, tasks_of_b
):
    make_row(tenant, state=OutboxState.DEAD)
    add_event(tenant, at=db_now())
    reviewer = person("reviewer", tenant)

    response = logged_in(reviewer).get(INDEX)

    assert response.status_code == 200
    figures = response.context["dashboard"]
    assert [t.tenant for t in figures.tasks] == [tenant]
    assert figures.outbox == []
    html = response.content.decode()
    assert 'id="dash-takeover"' in html and 'id="dash-events"' in html
    assert 'id="dash-outbox"' not in html
    assert other_tenant.slug not in html
    assert re.search(r'data-state="human_required"><a [^>]*>3</a>', html)
    # The queue's figures open the takeover desk, filtered to the tenant.
    desk = f"/admin/console/takeoveritem/?state=human_required&amp;tenant={tenant.pk}"
    assert f'href="{desk}"' in html
    desk_page = logged_in(reviewer).get(desk.replace("&amp;", "&"))
    assert desk_page.status_code == 200
    assert "VERSION_CONFLICT" in html
    assert "<svg" in html
    # The app list is still there, below the dashboard.
    assert html.index('id="dashboard"') < html.index('class="app-')


@pytest.mark.django_db
def test_support_sees_the_same_figures_without_the_outbox(tenant, tasks_of_a):
    support = person("support", tenant)
    figures = logged_in(support).get(INDEX).context["dashboard"]
    assert state_counts(figures.tasks[0])["human_required"] == 3
    assert figures.outbox == []


@pytest.mark.django_db
def test_a_tenant_admin_also_sees_the_relay(tenant, other_tenant, tasks_of_a):
    make_row(tenant, state=OutboxState.DEAD)
    make_row(tenant, created_ago_s=90)
    make_row(other_tenant, state=OutboxState.DEAD)
    admin = person("admin", tenant)

    response = logged_in(admin).get(INDEX)

    (outbox,) = response.context["dashboard"].outbox
    assert outbox.tenant == tenant
    assert (outbox.pending.value, outbox.dead.value) == (1, 1)
    assert outbox.relay_lag_s == pytest.approx(90, abs=5)
    assert 'id="dash-outbox"' in response.content.decode()


@pytest.mark.django_db
def test_a_member_of_tenant_b_sees_only_tenant_b(
    tenant, other_tenant, tasks_of_a, tasks_of_b
):
    b_admin = person("admin", other_tenant)

    response = logged_in(b_admin).get(INDEX)

    figures = response.context["dashboard"]
    assert [t.tenant for t in figures.tasks] == [other_tenant]
    assert [o.tenant for o in figures.outbox] == [other_tenant]
    assert state_counts(figures.tasks[0])["human_required"] == 7
    assert figures.tasks[0].reasons == []
    assert tenant.slug not in response.content.decode()


@pytest.mark.django_db
def test_staff_without_a_membership_is_told_whom_to_ask(tenant, tasks_of_a):
    nobody = person()

    response = logged_in(nobody).get(INDEX)

    assert response.status_code == 200
    html = response.content.decode()
    assert "You have no tenant membership yet; ask a tenant administrator" in html
    assert "have permission to view or edit anything" not in html
    assert 'id="dashboard"' not in html and tenant.slug not in html


@pytest.mark.django_db
def test_the_index_runs_a_bounded_number_of_queries(tenant, make_tenant, make_task):
    # given: a tenant admin of one tenant, and one of five busier tenants
    one = person("admin", tenant)
    make_task(state=TaskState.HUMAN_REQUIRED)
    five = [make_tenant() for _ in range(5)]
    many = person("admin", *five)
    for other in five:
        for state in TaskState.values:
            make_task(tenant=other, state=state)
        make_row(other, state=OutboxState.DEAD)
        add_event(other, at=db_now())

    def queries(user) -> int:
        client = logged_in(user)
        with CaptureQueriesContext(connection) as captured:
            assert client.get(INDEX).status_code == 200
        return len(captured)

    # then: the same statements, whatever the number of tenants and rows
    assert queries(one) == queries(many) <= 20
