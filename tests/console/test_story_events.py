"""The event browser: exact searches, typed filters, names, bounded queries."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import services as audit_services
from audit.models import EventCode
from console import search
from console.display import short_id
from portal.actors import Actor
from portal.tracing import Trace
from tasks.models import Operation, TaskState

pytestmark = pytest.mark.django_db

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HUMAN_TRACE = "11111111111111111111111111111111"


def _event(task, code=EventCode.TASK_TRANSITIONED, *, actor, trace=TRACE, **kw):
    with transaction.atomic():
        return audit_services.event_append(
            tenant_id=task.tenant_id,
            task_id=task.pk,
            code=code,
            actor=actor,
            trace=Trace(trace_id=trace, span_id="00f067aa0ba902b7"),
            **kw,
        )


def _listed(response) -> str:
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def reviewer(tenant, make_person):
    return make_person("rita", tenant=tenant, role="reviewer")


def test_a_trace_search_finds_the_human_actions_recorded_under_other_traces(
    make_task, agent, reviewer, login
):
    # given a task on a trace, and a person's claim recorded under a new trace
    task = make_task(state=TaskState.HUMAN_REQUIRED, trace_id=TRACE)
    agent_event = _event(task, actor=Actor.of_agent(agent))
    human_event = _event(
        task,
        EventCode.TASK_HUMAN_CLAIMED,
        actor=Actor.of_user(reviewer),
        trace=HUMAN_TRACE,
    )
    unrelated = _event(make_task(), actor=Actor.of_agent(agent), trace="2" * 32)
    # when the reviewer searches the event browser by the task's trace id
    html = _listed(login(reviewer).get("/admin/audit/event/", {"q": TRACE}))
    # then both events are there, by name, and the unrelated one is not
    assert str(agent_event) in html and str(human_event) in html
    assert str(unrelated) not in html
    assert "rita (person)" in html and f"{agent.name} (agent)" in html


def test_searches_by_object_id_idempotency_key_and_ids_are_exact(
    make_task, make_operation, agent, reviewer, login
):
    task = make_task(object_id="ISSUE-77", state=TaskState.RUNNING, leased=True)
    operation = make_operation(task=task, idempotency_key="create:ISSUE-77")
    by_task = _event(task, actor=Actor.of_agent(agent))
    with transaction.atomic():
        by_op = audit_services.event_append(
            tenant_id=task.tenant_id,
            task_id=None,
            operation_id=operation.pk,
            code=EventCode.OPERATION_RESERVED,
            actor=Actor.of_agent(agent),
        )
    client = login(reviewer)
    html = _listed(client.get("/admin/audit/event/", {"q": "ISSUE-77"}))
    assert str(by_task) in html and str(by_op) not in html
    html = _listed(client.get("/admin/audit/event/", {"q": "create:ISSUE-77"}))
    assert str(by_op) in html and str(by_task) not in html
    html = _listed(client.get("/admin/audit/event/", {"q": str(task.pk)}))
    assert str(by_task) in html
    html = _listed(client.get("/admin/audit/event/", {"q": str(by_op)}))
    assert str(by_op) in html and str(by_task) not in html
    # exact: a prefix or another case finds nothing
    html = _listed(client.get("/admin/audit/event/", {"q": "issue-77"}))
    assert str(by_task) not in html


def test_the_search_sql_compares_columns_not_upper(make_task, reviewer):
    from audit.models import Event

    queryset = search.event_search(
        Event.objects.all(), tenant_ids=[uuid.uuid4()], term=TRACE
    )
    sql = str(queryset.query)
    assert "UPPER" not in sql and '"audit_event"."trace_id" = ' in sql


def test_another_tenants_events_never_match(
    make_task, other_tenant, make_agent, reviewer, login
):
    theirs = make_task(tenant=other_tenant, trace_id=TRACE)
    hidden = _event(theirs, actor=Actor.of_agent(make_agent(tenant=other_tenant)))
    client = login(reviewer)
    for query in ({"q": TRACE}, {"q": str(theirs.pk)}, {"task": str(theirs.pk)}, {}):
        assert str(hidden) not in _listed(client.get("/admin/audit/event/", query))


def test_filters_by_task_actor_code_and_time_and_bad_input_is_no_500(
    make_task, agent, reviewer, login
):
    task, other = make_task(), make_task()
    mine = _event(task, actor=Actor.of_agent(agent))
    theirs = _event(other, EventCode.TASK_WOKEN, actor=Actor.system("wake-up"))
    client = login(reviewer)
    html = _listed(client.get("/admin/audit/event/", {"task": str(task.pk)}))
    assert str(mine) in html and str(theirs) not in html
    html = _listed(client.get("/admin/audit/event/", {"actor": agent.name}))
    assert str(mine) in html and str(theirs) not in html
    html = _listed(client.get("/admin/audit/event/", {"actor": "wake-up"}))
    assert str(theirs) in html and str(mine) not in html
    html = _listed(client.get("/admin/audit/event/", {"code__exact": "task.woken"}))
    assert str(theirs) in html and str(mine) not in html
    html = _listed(
        client.get(
            "/admin/audit/event/",
            {"created_from": "2000-01-01", "created_to": "2999-01-01"},
        )
    )
    assert str(mine) in html and str(theirs) in html
    html = _listed(client.get("/admin/audit/event/", {"created_to": "2000-01-01"}))
    assert str(mine) not in html
    for bad in (
        {"task": "not-a-uuid"},
        {"created_from": "yesterday"},
        {"created_to": "2026-13-45"},
        {"actor": "agent:"},
        {"tenant": "nope"},
        {"q": "x" * 5000},
    ):
        response = client.get("/admin/audit/event/", bad)
        assert response.status_code in (200, 302), bad


def test_short_ids_carry_the_full_id_and_a_link(make_task, agent, reviewer, login):
    task = make_task()
    event_id = _event(task, actor=Actor.of_agent(agent))
    html = _listed(login(reviewer).get("/admin/audit/event/"))
    assert f'title="{task.pk}"><code>{short_id(task.pk)}</code>' in html
    assert f'href="/admin/tasks/task/{task.pk}/change/"' in html
    assert f'href="/admin/audit/event/{event_id}/change/"' in html
    assert f'title="{TRACE}"' in html


def test_the_event_list_costs_the_same_queries_for_5_or_100_rows(
    make_task, make_agent, tenant, reviewer, login
):
    client = login(reviewer)
    counts = []
    for rows in (5, 100):
        task = make_task()
        for index in range(rows):
            actor = (
                Actor.of_agent(make_agent(tenant=tenant))
                if index % 2
                else Actor.system(f"job-{index}")
            )
            _event(task, actor=actor)
        with CaptureQueriesContext(connection) as queries:
            _listed(client.get("/admin/audit/event/", {"task": str(task.pk)}))
        counts.append(len(queries))
        assert not any(
            "COUNT(*)" in q["sql"] and "LIMIT" not in q["sql"] for q in queries
        )
    assert counts[0] == counts[1], counts


def test_the_task_list_searches_exactly_and_never_counts_everything(
    make_task, reviewer, login
):
    task = make_task(object_id="OBJ-1", trace_id=TRACE)
    other = make_task(object_id="OBJ-10")
    client = login(reviewer)
    for term in ("OBJ-1", TRACE, task.client_task_id, str(task.pk)):
        with CaptureQueriesContext(connection) as queries:
            html = _listed(client.get("/admin/tasks/task/", {"q": term}))
        assert f"/admin/tasks/task/{task.pk}/change/" in html, term
        assert f"/admin/tasks/task/{other.pk}/change/" not in html, term
        assert not any("UPPER" in q["sql"] for q in queries)


def test_the_operation_list_searches_by_key(make_operation, reviewer, login):
    operation = make_operation(idempotency_key="key-exact")
    make_operation(idempotency_key="key-exact-2")
    html = _listed(login(reviewer).get("/admin/tasks/operation/", {"q": "key-exact"}))
    assert html.count("/admin/tasks/operation/") >= 1
    assert "key-exact-2" not in html and short_id(operation.pk) in html
    assert Operation.objects.count() == 2
