"""A task's page tells its whole story, read-only, in a bounded number of queries."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import services as audit_services
from audit.models import EventCode
from portal.actors import Actor
from portal.tracing import Trace
from tasks.models import Credential, Escalation, OperationState, TaskState

pytestmark = pytest.mark.django_db

TRACE = "0af7651916cd43dd8448eb211c80319c"
SECRET = "agp_0123456789ab.x"


def _story(make_task, make_operation, agent, person, *, events=3, operations=2):
    task = make_task(state=TaskState.RUNNING, leased=True, trace_id=TRACE)
    ops = [
        make_operation(task=task, state=OperationState.EXECUTING)
        for _ in range(operations)
    ]
    for op in ops:
        Credential.objects.create(
            tenant=task.tenant,
            operation=op,
            object_type="customer_issue",
            object_id=task.object_id,
            fields=["status"],
            action="create_ticket",
            target="ticket-desk",
            secret_hash="f" * 64,
            expires_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC),
        )
    Escalation.objects.create(
        tenant=task.tenant,
        task=task,
        operation=ops[0],
        reason_code="VERSION_CONFLICT",
        evidence={"current_version": "7", "read_version": "6"},
        responsible_owner="desk-team",
        resolved_by=person,
        resolution="retry",
        resolved_at=dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
    )
    with transaction.atomic():
        for index in range(events):
            audit_services.event_append(
                tenant_id=task.tenant_id,
                task_id=task.pk,
                operation_id=ops[index % operations].pk,
                code=EventCode.OPERATION_EXECUTING,
                actor=Actor.of_agent(agent) if index % 2 else Actor.of_user(person),
                reason="VERSION_CONFLICT",
                contract=("customer-issue", 3),
                data={"step": index, "nested": {"api_key_seen": SECRET, "n": 1}},
                trace=Trace(trace_id=TRACE, span_id="b7ad6b7169203331"),
            )
    return task, ops


def test_a_reviewer_reads_the_whole_story_of_a_task(
    make_task, make_operation, agent, tenant, make_person, login, settings
):
    # given a task with events by an agent and a person, operations, credentials,
    # an escalation and a lease
    settings.PORTAL_TRACE_URL_TEMPLATE = "http://traces.example/trace/{trace_id}"
    reviewer = make_person("rita", tenant=tenant, role="reviewer")
    task, ops = _story(make_task, make_operation, agent, reviewer)
    # when the reviewer opens the task's page
    page = login(reviewer).get(f"/admin/tasks/task/{task.pk}/change/")
    html = page.content.decode()
    # then the timeline names the actors, shows milliseconds and the links
    assert page.status_code == 200
    assert f"{agent.name} (agent)" in html and "rita (person)" in html
    assert re.search(r"\d{2}:\d{2}:\d{2}\.\d{3}", html)
    assert "customer-issue v3" in html and "VERSION_CONFLICT" in html
    assert f'href="http://traces.example/trace/{TRACE}"' in html
    assert "b7ad6b7169203331" in html
    # the payload reads as key: value lines, its secret redacted when written
    assert "<dt>nested.api_key_seen</dt><dd>[REDACTED]</dd>" in html
    assert SECRET not in html and "agp_0123456789ab" not in html
    # operations, credential metadata (never the secret hash), escalation, lease
    for op in ops:
        assert f"/admin/tasks/operation/{op.pk}/change/" in html
        assert op.idempotency_key in html
    assert "f" * 64 not in html
    assert "/admin/tasks/credential/" in html and "2099-01-01" in html
    assert "/admin/tasks/escalation/" in html and "desk-team" in html
    assert "<dt>current_version</dt><dd>7</dd>" in html
    assert "retry" in html and "rita" in html
    assert "worker-1" in html  # the lease owner
    # and nothing can be saved or deleted
    assert 'name="_save"' not in html and "deletelink" not in html


def test_the_trace_is_plain_text_without_a_viewer(
    make_task, tenant, make_person, login, settings
):
    settings.PORTAL_TRACE_URL_TEMPLATE = ""
    reviewer = make_person("rita", tenant=tenant, role="reviewer")
    task = make_task(trace_id=TRACE)
    html = login(reviewer).get(f"/admin/tasks/task/{task.pk}/change/").content.decode()
    assert TRACE in html and "/trace/" not in html


def test_the_task_page_costs_the_same_queries_whatever_the_story_size(
    make_task, make_operation, agent, tenant, make_person, login
):
    # given a small story and one twenty times bigger
    reviewer = make_person("rita", tenant=tenant, role="reviewer")
    client = login(reviewer)
    counts = []
    for events, operations in ((2, 1), (40, 20)):
        task, _ = _story(
            make_task,
            make_operation,
            agent,
            reviewer,
            events=events,
            operations=operations,
        )
        # when each page is read (once first, so the per-process content-type cache
        # is warm and both counts measure the page itself)
        client.get(f"/admin/tasks/task/{task.pk}/change/")
        with CaptureQueriesContext(connection) as queries:
            assert client.get(f"/admin/tasks/task/{task.pk}/change/").status_code == 200
        counts.append(len(queries))
    # then the bigger story costs no more queries: one per section, none per row
    # (session, user, the admin's permission checks, the export permission for the
    # evidence button, the person's tenants for the row-level-security scope, the
    # task, events, operations, credentials, approvals (and their decisions when
    # there are any: one more), escalations, agent names, user names)
    assert counts[0] == counts[1], counts
    assert counts[1] <= 21, counts


def test_another_tenants_task_is_not_found_and_support_reads_but_cannot_save(
    make_task, tenant, other_tenant, make_person, login
):
    task = make_task(tenant=other_tenant)
    reviewer = make_person("rita", tenant=tenant, role="reviewer")
    client = login(reviewer)
    response = client.get(f"/admin/tasks/task/{task.pk}/change/")
    assert response.status_code == 302  # the admin's "does not exist" redirect
    own = make_task()
    support = make_person("sam", tenant=tenant, role="support")
    client = login(support)
    assert client.get(f"/admin/tasks/task/{own.pk}/change/").status_code == 200
    before = own.state_version
    refused = client.post(f"/admin/tasks/task/{own.pk}/change/", {"state": "cancelled"})
    assert refused.status_code == 403
    own.refresh_from_db()
    assert own.state_version == before and own.state == TaskState.PENDING
