"""What a person can do with a refused task, end to end against the ticket desk.

For a ``FIELD_STALE`` task neither approving the stale input nor cancelling was
right (issue 8 §3). A person now edits the field with a fresh value (the gateway
re-checks everything and calls once, under the same key) or hands the task back
for a fresh read; a tenant admin can release a stale claim; every step joins the
task's own trace.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User

from audit.models import Event
from portal import services as portal_services
from portal.db import db_now
from portal.models import Role
from tasks import takeover
from tasks.exceptions import ApprovalRepeatsRefusal, NotYourClaim
from tasks.gateway import FieldValue
from tasks.models import Escalation, Operation, OperationState, Task, TaskState

from .conftest import World, minutes_ago

pytestmark = pytest.mark.django_db(transaction=True)


def person(world: World, name: str, role: Role) -> User:
    user = User.objects.create_user(name, password="pw-for-tests-only-1")
    portal_services.membership_grant(tenant=world.tenant, user=user, role=role)
    return user


def stale_task(world: World) -> tuple[dict, Task]:
    started = world.start_task()
    response = world.execute(
        started, world.fields(email={"observed_at": minutes_ago(10)})
    )
    assert response.json()["code"] == "FIELD_STALE"
    return started, Task.objects.get(pk=started["task"]["id"])


def fresh(name: str, value: str, source: str, age_s: float = 0) -> FieldValue:
    return FieldValue(
        name=name,
        value=value,
        source=source,
        observed_at=db_now() - dt.timedelta(seconds=age_s),
    )


def test_a_person_edits_the_stale_field_and_the_gateway_calls_once(world: World):
    started, task = stale_task(world)
    sam = person(world, "sam", Role.SUPPORT)
    takeover.task_human_claim(task=task, user=sam)

    outcome = takeover.task_human_edit(
        task=task,
        user=sam,
        operation_id=started["operation"]["id"],
        fields=[
            fresh("email", "ana@example.com", "crm"),
            fresh("plan", "pro", "billing"),
        ],
        note="checked the CRM by phone",
    )

    assert outcome.result.outcome == "verified"
    assert world.tickets() == 1
    assert outcome.task.state == TaskState.PENDING  # back to automation
    codes = list(
        Event.objects.filter(task_id=task.pk)
        .order_by("id")
        .values_list("code", "actor_type", "actor_id")
    )
    by_sam = ("user", str(sam.pk))
    assert ("operation.fields_edited", *by_sam) in codes
    assert ("connector.called", *by_sam) in codes
    assert ("operation.verified", *by_sam) in codes
    assert ("task.resolved", *by_sam) in codes
    edited = Event.objects.get(task_id=task.pk, code="operation.fields_edited")
    assert "ana@example.com" not in str(edited.payload)  # names and times only

    # the agent comes back: the same key reports the ticket, no second call
    lease = world.http.post(f"/api/v1/tasks/{task.pk}/lease", json={"owner": "w2"})
    token = lease.json()["lease"]["token"]
    again = world.execute(started, token=token)
    assert again.json()["outcome"] == "verified", again.text
    assert world.tickets() == 1


def test_an_edit_that_is_still_stale_is_refused_and_stays_with_the_person(
    world: World,
):
    started, task = stale_task(world)
    sam = person(world, "sam", Role.SUPPORT)
    takeover.task_human_claim(task=task, user=sam)

    outcome = takeover.task_human_edit(
        task=task,
        user=sam,
        operation_id=started["operation"]["id"],
        fields=[
            fresh("email", "ana@example.com", "crm", age_s=900),
            fresh("plan", "pro", "billing"),
        ],
    )

    assert outcome.result.outcome == "refused"
    assert outcome.result.reason == "FIELD_STALE"
    assert world.tickets() == 0
    current = Task.objects.get(pk=task.pk)
    assert (current.state, current.lease_owner) == (
        TaskState.HUMAN_CLAIMED,
        f"user:{sam.pk}",
    )
    assert Escalation.objects.filter(task=task, resolved_at__isnull=True).count() == 2


def test_approving_a_stale_input_is_refused_and_a_hand_back_gets_a_fresh_read(
    world: World,
):
    started, task = stale_task(world)
    sam = person(world, "sam", Role.SUPPORT)
    takeover.task_human_claim(task=task, user=sam)
    with pytest.raises(ApprovalRepeatsRefusal) as refused:
        takeover.task_human_resolve(
            task=task,
            user=sam,
            resolution="approve",
            operation_id=started["operation"]["id"],
        )
    assert refused.value.code == "APPROVAL_NOT_ALLOWED"
    assert Task.objects.get(pk=task.pk).state == TaskState.HUMAN_CLAIMED

    takeover.task_human_resolve(
        task=task,
        user=sam,
        resolution="hand_back",
        operation_id=started["operation"]["id"],
        note="read the e-mail again",
    )
    lease = world.http.post(f"/api/v1/tasks/{task.pk}/lease", json={"owner": "w2"})
    token = lease.json()["lease"]["token"]
    retried = world.execute(started, token=token)  # fresh values, same key
    assert retried.json()["outcome"] == "verified", retried.text
    assert world.tickets() == 1
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert operation.state == OperationState.VERIFIED


def test_only_the_claimer_or_a_tenant_admin_releases_a_claim(world: World):
    _, task = stale_task(world)
    sam = person(world, "sam", Role.SUPPORT)
    kim = person(world, "kim", Role.SUPPORT)
    boss = person(world, "boss", Role.ADMIN)
    takeover.task_human_claim(task=task, user=sam)

    with pytest.raises(NotYourClaim):
        takeover.task_human_release(task=task, user=kim)
    released = takeover.task_human_release(task=task, user=boss)

    assert released.state == TaskState.HUMAN_REQUIRED
    event = Event.objects.filter(task_id=task.pk, code="task.human_released").get()
    assert event.actor_id == str(boss.pk)
    assert event.payload["released_for"] == f"user:{sam.pk}"


def test_a_persons_steps_carry_the_tasks_trace_id(world: World):
    _, task = stale_task(world)
    assert task.trace_id
    sam = person(world, "sam", Role.SUPPORT)
    takeover.task_human_claim(task=task, user=sam)
    takeover.task_human_release(task=task, user=sam)
    human = Event.objects.filter(task_id=task.pk, actor_type="user")
    assert human.count() == 2
    assert set(human.values_list("trace_id", flat=True)) == {task.trace_id}


def test_the_staff_api_edits_over_http_and_refuses_other_roles(world: World):
    from rest_framework.test import APIClient

    started, task = stale_task(world)
    sam = person(world, "sam", Role.SUPPORT)
    rita = person(world, "rita", Role.REVIEWER)
    takeover.task_human_claim(task=task, user=sam)
    body = {
        "operation_id": started["operation"]["id"],
        "field_values": world.fields(),
        "note": "phoned the customer",
    }
    url = f"/api/v1/takeover/tasks/{task.pk}/edit"

    reviewer = APIClient()
    reviewer.force_login(rita)
    assert reviewer.post(url, body, format="json").status_code == 404
    assert world.tickets() == 0

    support = APIClient()
    support.force_login(sam)
    answer = support.post(url, body, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["outcome"] == "verified"
    assert answer.json()["task"]["state"] == "pending"
    assert world.tickets() == 1
    again = support.post(url, body, format="json")  # no longer claimed by sam
    assert again.status_code == 409
    assert world.tickets() == 1
