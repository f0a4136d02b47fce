"""The desk's resolutions: edit the fields and execute, approve where it helps, hand
back with a note; as support, reviewer and a member of another tenant.

The edits run against the real ticket desk on 127.0.0.1 (tests/gateway/conftest.py's
world): a task refused ``FIELD_STALE`` by the gateway, claimed at the desk, then
executed with the values a person gives. Nothing here is mocked.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client

from audit.models import Event, EventCode
from portal.actors import Actor
from portal.db import db_now
from portal.models import Role, Tenant
from tasks import escalation, sealed
from tasks.gateway import FieldValue
from tasks.models import (
    Approval,
    Escalation,
    Operation,
    OperationState,
    Task,
    TaskState,
)
from tests.console.test_desk import make_person, messages_of
from tests.gateway import conftest as gateway_world
from tests.gateway.conftest import World, minutes_ago

# The gateway tests' world, fixtures by name: a real ticket desk, a published
# contract, a connector and an agent with a key.
world = gateway_world.world

DESK = "/admin/console/takeoveritem/"


def as_(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(task: Task) -> str:
    return f"{DESK}{task.pk}/change/"


def stale_task(world: World) -> tuple[Task, Operation]:
    """A task the gateway refused because the agent's e-mail was 10 minutes old."""
    started = world.start_task()
    response = world.execute(
        started, world.fields(email={"observed_at": minutes_ago(10)})
    )
    assert response.json()["code"] == "FIELD_STALE", response.text
    task = Task.objects.get(pk=started["task"]["id"])
    assert (task.state, task.reason_code) == (TaskState.HUMAN_REQUIRED, "FIELD_STALE")
    return task, Operation.objects.get(pk=started["operation"]["id"])


def edit_post(
    operation: Operation,
    *,
    email: str = "ana.new@example.com",
    email_read: str | None = None,
    plan_read: str | None = None,
    **overrides: str,
) -> dict[str, str]:
    """The edit form as the page sends it: one row per required field."""
    now = db_now()
    data = {
        "operation_id": str(operation.pk),
        "note": "called the customer; CRM updated",
        "field-0-name": "email",
        "field-0-value": email,
        "field-0-source": "crm",
        "field-0-observed_at": email_read or now.isoformat(),
        "field-1-name": "plan",
        "field-1-value": "pro",
        "field-1-source": "billing",
        # as a datetime-local input sends it: no offset, the portal's zone (UTC)
        "field-1-observed_at": plan_read
        or now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S"),
    }
    data.update(overrides)
    return data


def trail(task: Task) -> list[tuple[str, str, str]]:
    return list(
        Event.objects.filter(task_id=task.pk)
        .order_by("id")
        .values_list("code", "actor_type", "actor_id")
    )


def snapshot(task: Task) -> tuple[Any, ...]:
    current = Task.objects.get(pk=task.pk)
    operations = tuple(
        Operation.objects.filter(task_id=task.pk)
        .order_by("pk")
        .values_list("state", "state_version", "provider_reference")
    )
    return (
        current.state,
        current.state_version,
        current.lease_owner,
        operations,
        Escalation.objects.filter(task_id=task.pk).count(),
        len(trail(task)),
    )


@pytest.fixture
def sam(world: World) -> User:
    return make_person("sam", {world.tenant: Role.SUPPORT})


@pytest.fixture
def claimed(world: World, sam: User) -> tuple[Task, Operation, Client]:
    task, operation = stale_task(world)
    client = as_(sam)
    response = client.post(f"{DESK}{task.pk}/claim/", follow=True)
    assert any("You claimed this task" in m for m in messages_of(response))
    return task, operation, client


# --- edit and execute ---------------------------------------------------------------


def test_the_edit_form_has_one_row_per_required_field_of_the_pinned_contract(
    claimed,
):
    task, operation, client = claimed
    response = client.get(page(task))
    body = response.content.decode()
    assert 'id="desk-edit-form"' in body
    assert f'value="{operation.pk}"' in body
    rows = re.findall(r'<tr data-field="([^"]+)" class="([^"]+)">', body)
    # the stale e-mail is asked; the plan the agent gave passes still and is kept
    assert rows == [("email", "desk-asked"), ("plan", "desk-kept")]
    assert 'name="field-0-source" id="desk-edit-0-source" value="crm"' in body
    assert 'name="field-1-source" id="desk-edit-1-source" value="billing"' in body
    why = re.search(r'id="desk-edit-0-why">(.*?)</td>', body, re.S)
    assert why is not None
    assert re.search(
        r"Asked</strong> &mdash; the fields check refused it \(FIELD_STALE\): "
        r"email was read 10 min before the check; the contract allows 5 min; "
        r"read \[email:hm_\w+\] from crm at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC",
        why.group(1),
    ), why.group(1)
    assert "ana@example.com" not in body  # the value read, as the redaction allows
    kept = re.search(r'id="desk-edit-1-why">(.*?)</td>', body, re.S)
    assert kept is not None
    assert re.search(
        r"Kept</strong> &mdash; pro from billing, read at [\d-]+ [\d:]+ UTC; "
        r"passes the fields check until [\d-]+ [\d:]+ UTC",
        kept.group(1),
    ), kept.group(1)
    assert 'placeholder="keep pro"' in body
    assert re.search(r'name="field-0-value"[^>]*required', body)
    assert not re.search(r'name="field-1-value"[^>]*required', body)
    assert "read at most 5 min before the check" in body  # max_age_s 300
    assert "read at most 1 h before the check" in body  # max_age_s 3600
    # read at is prefilled with the database's now, as a datetime-local value
    prefilled = re.search(r'name="field-0-observed_at"[^>]*value="([^"]+)"', body)
    assert prefilled is not None
    read_at = dt.datetime.fromisoformat(prefilled.group(1)).replace(tzinfo=dt.UTC)
    assert abs(read_at - db_now()) < dt.timedelta(minutes=1)


def test_support_edits_the_stale_email_and_the_desk_makes_exactly_one_ticket(
    world: World, claimed, sam
):
    # Given sam holds a FIELD_STALE task
    task, operation, client = claimed

    # When sam gives the fresh e-mail with its source and read time
    response = client.post(f"{DESK}{task.pk}/edit/", edit_post(operation), follow=True)

    # Then the ticket desk made exactly one ticket, and the message names it
    assert response.status_code == 200
    assert world.tickets() == 1
    assert world.tickets(operation.idempotency_key) == 1
    operation.refresh_from_db()
    assert operation.state == OperationState.VERIFIED
    assert operation.provider_reference
    assert messages_of(response) == [
        f"Executed: ticket {operation.provider_reference} verified; "
        "the task went back to the agent."
    ]
    # the task went back to automation, its escalations settled
    current = Task.objects.get(pk=task.pk)
    assert (current.state, current.lease_owner) == (TaskState.PENDING, None)
    assert not Escalation.objects.filter(task_id=task.pk, resolved_at__isnull=True)
    # and every step names the person
    by_sam = ("user", str(sam.pk))
    codes = trail(task)
    for code in (
        EventCode.OPERATION_FIELDS_EDITED,
        EventCode.CONNECTOR_CALLED,
        EventCode.OPERATION_VERIFIED,
        EventCode.TASK_RESOLVED,
    ):
        assert (code, *by_sam) in codes, code
    edited = Event.objects.get(task_id=task.pk, code=EventCode.OPERATION_FIELDS_EDITED)
    assert [f["name"] for f in edited.payload["fields"]] == ["email", "plan"]
    assert "ana.new@example.com" not in str(edited.payload)  # names and times only
    resolved = Event.objects.get(task_id=task.pk, code=EventCode.TASK_RESOLVED)
    # recorded as what sam did, not as a hand back (the task moves as on one)
    assert resolved.payload["resolution"] == "edited_and_executed"
    assert set(
        Escalation.objects.filter(task_id=task.pk).values_list("resolution", flat=True)
    ) == {"edited_and_executed"}
    # and the task's story says so, to a reviewer
    rita = make_person("rita", {world.tenant: Role.REVIEWER})
    story = as_(rita).get(f"/admin/tasks/task/{task.pk}/change/").content.decode()
    assert re.search(r"<td>edited_and_executed</td>\s*<td>sam</td>", story)
    assert "<dt>resolution</dt><dd>edited_and_executed</dd>" in story
    # the page, still readable, shows the step by name
    assert re.search(
        r"sam \(person\)</span></td>\s*<td class=\"nowrap\"><strong>"
        r"operation\.fields_edited</strong>",
        response.content.decode(),
    )


def test_an_edit_that_gives_only_the_asked_field_keeps_the_agents_plan(
    world: World, claimed, sam
):
    # Given sam holds the FIELD_STALE task; the agent's plan passed the check
    task, operation, client = claimed
    agent_read = Event.objects.filter(
        task_id=task.pk, code=EventCode.GATEWAY_CHECKED
    ).count()
    assert agent_read

    # When sam gives only the e-mail, leaving the kept plan empty (as the page sends)
    response = client.post(
        f"{DESK}{task.pk}/edit/",
        edit_post(operation, **{"field-1-value": "", "field-1-source": ""}),
        follow=True,
    )

    # Then one ticket, executed with the plan the agent read (source and read time)
    assert messages_of(response)[0].startswith("Executed: ticket "), messages_of(
        response
    )
    assert world.tickets() == 1
    edited = Event.objects.get(task_id=task.pk, code=EventCode.OPERATION_FIELDS_EDITED)
    plan = next(f for f in edited.payload["fields"] if f["name"] == "plan")
    email = next(f for f in edited.payload["fields"] if f["name"] == "email")
    assert plan["source"] == "billing"
    # the agent's read time, not the person's (they read the e-mail just now)
    assert dt.datetime.fromisoformat(plan["observed_at"]) < dt.datetime.fromisoformat(
        email["observed_at"]
    )
    assert Task.objects.get(pk=task.pk).state == TaskState.PENDING


def test_a_kept_value_that_aged_past_the_contract_is_asked_with_the_reason(
    world: World, claimed
):
    # Given time passed: the plan the agent read is now 2 h old (max 1 h)
    task, operation, client = claimed
    two_hours_ago = db_now() - dt.timedelta(hours=2)
    with transaction.atomic():
        locked = Operation.objects.select_for_update().get(pk=operation.pk)
        sealed.keep_given_fields(
            locked,
            [
                FieldValue(
                    name="email",
                    value="ana@example.com",
                    source="crm",
                    observed_at=db_now() - dt.timedelta(minutes=10),
                ),
                FieldValue(
                    name="plan",
                    value="pro",
                    source="billing",
                    observed_at=two_hours_ago,
                ),
            ],
        )

    body = client.get(page(task)).content.decode()

    rows = re.findall(r'<tr data-field="([^"]+)" class="([^"]+)">', body)
    assert rows == [("email", "desk-asked"), ("plan", "desk-asked")]
    why = re.search(r'id="desk-edit-1-why">(.*?)</td>', body, re.S)
    assert why is not None
    assert (
        "it passed at the check but is now older than the contract allows (1 h); "
        "read pro from billing at " + two_hours_ago.strftime("%Y-%m-%d %H:%M:%S UTC")
    ) in why.group(1)
    # and leaving it empty is now a message, not a refused call
    before = snapshot(task)
    response = client.post(
        f"{DESK}{task.pk}/edit/",
        edit_post(operation, **{"field-1-value": ""}),
        follow=True,
    )
    assert any("plan value: give the fresh value" in m for m in messages_of(response))
    assert snapshot(task) == before
    assert world.tickets() == 0


def test_a_member_of_another_tenant_sees_neither_the_kept_values_nor_the_form(
    world: World, claimed, other_tenant: Tenant
):
    task, _, _ = claimed
    bob = make_person("bob", {other_tenant: Role.ADMIN})
    client = as_(bob)
    response = client.get(page(task))
    assert response.status_code == 302  # the admin's "no such object"
    followed = client.get(response["Location"]).content.decode()
    assert "keep pro" not in followed and "issue-1042" not in followed


def test_an_edit_that_is_still_stale_is_refused_and_stays_with_the_person(
    world: World, claimed, sam
):
    task, operation, client = claimed
    escalations = Escalation.objects.filter(task_id=task.pk).count()

    response = client.post(
        f"{DESK}{task.pk}/edit/",
        edit_post(operation, email_read=minutes_ago(15)),
        follow=True,
    )

    assert response.status_code == 200
    assert messages_of(response) == [
        "The gateway refused it again: FIELD_STALE — email was read 15 min before "
        "the check; the contract allows 5 min; the task stays with you."
    ]
    assert world.tickets() == 0
    current = Task.objects.get(pk=task.pk)
    assert (current.state, current.lease_owner) == (
        TaskState.HUMAN_CLAIMED,
        f"user:{sam.pk}",
    )
    assert Operation.objects.get(pk=operation.pk).state == (
        OperationState.HUMAN_REQUIRED
    )
    # a new escalation holds the evidence, and the form is there to try again
    assert Escalation.objects.filter(task_id=task.pk).count() == escalations + 1
    body = response.content.decode()
    assert 'id="desk-edit-form"' in body
    assert re.search(r"age_s=900[.\d]* max_age_s=300", body)  # the new evidence


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"field-0-value": ""}, "email value: give the fresh value"),
        ({"field-0-value": "   "}, "email value: give the fresh value"),
        ({"field-1-observed_at": "yesterday"}, "plan observed_at: read at is not"),
        ({"field-0-observed_at": ""}, "email observed_at: say when you read it"),
        ({"field-0-source": ""}, "email source: say where you read it"),
        ({"operation_id": ""}, "operation_id: choose the operation"),
        ({"operation_id": "not-a-uuid"}, "Not executed: operation_id"),
        ({"field-0-name": "phone"}, "email: the form is out of date"),
        (
            {"operation_id": "00000000-0000-0000-0000-000000000001"},
            "No such operation",
        ),
    ],
)
def test_bad_edits_are_messages_and_change_nothing(
    world: World, claimed, change, message
):
    task, operation, client = claimed
    before = snapshot(task)

    response = client.post(
        f"{DESK}{task.pk}/edit/", edit_post(operation, **change), follow=True
    )

    assert response.status_code == 200
    assert any(message in m for m in messages_of(response)), messages_of(response)
    assert snapshot(task) == before
    assert world.tickets() == 0


def test_a_reviewers_edit_is_403_and_changes_nothing(world: World, claimed):
    task, operation, _ = claimed
    rita = make_person("rita", {world.tenant: Role.REVIEWER})
    before = snapshot(task)

    response = as_(rita).post(f"{DESK}{task.pk}/edit/", edit_post(operation))

    assert response.status_code == 403
    assert snapshot(task) == before
    assert world.tickets() == 0
    assert 'id="desk-edit-form"' not in as_(rita).get(page(task)).content.decode()


def test_a_member_of_another_tenant_gets_404_and_changes_nothing(
    world: World, claimed, other_tenant: Tenant
):
    task, operation, _ = claimed
    bob = make_person("bob", {other_tenant: Role.SUPPORT})
    before = snapshot(task)

    response = as_(bob).post(f"{DESK}{task.pk}/edit/", edit_post(operation))

    assert response.status_code == 404
    assert snapshot(task) == before
    assert world.tickets() == 0


def test_another_support_members_edit_is_refused_by_name(world: World, claimed):
    task, operation, _ = claimed
    kim = make_person("kim", {world.tenant: Role.SUPPORT})
    before = snapshot(task)
    kims_page = as_(kim).get(page(task)).content.decode()
    assert 'id="desk-edit-form"' not in kims_page  # only the claimer gets the form

    response = as_(kim).post(
        f"{DESK}{task.pk}/edit/", edit_post(operation), follow=True
    )

    assert any("claimed by sam" in m for m in messages_of(response))
    assert snapshot(task) == before
    assert world.tickets() == 0


def test_edit_needs_post_and_csrf(world: World, claimed, sam):
    task, operation, client = claimed
    assert client.get(f"{DESK}{task.pk}/edit/").status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(sam)
    before = snapshot(task)
    assert strict.post(f"{DESK}{task.pk}/edit/", edit_post(operation)).status_code == (
        403
    )
    assert snapshot(task) == before


def test_the_edit_view_opens_no_transaction_even_with_atomic_requests_on(
    world: World, claimed, monkeypatch
):
    """The gateway refuses to call out inside a transaction; the view is marked
    non-atomic, so even a project that turned ATOMIC_REQUESTS on would execute."""
    task, operation, client = claimed
    assert connection.settings_dict["ATOMIC_REQUESTS"] is False
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)

    response = client.post(f"{DESK}{task.pk}/edit/", edit_post(operation))

    assert response.status_code == 302
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", False)
    assert world.tickets() == 1
    assert Operation.objects.get(pk=operation.pk).state == OperationState.VERIFIED


# --- approve only where it helps; hand back with a note -----------------------------


def test_approve_is_hidden_and_refused_for_field_stale(world: World, claimed):
    task, operation, client = claimed
    body = client.get(page(task)).content.decode()
    options = re.findall(r'<option value="([a-z_]+)">', body)
    assert options == ["hand_back", "verify", "cancel", "fail", "complete"]
    assert "Approve is not offered: for FIELD_STALE" in body
    assert "Hand back for a fresh read</strong> &mdash; The agent reads" in body
    assert "Edit the fields</strong> &mdash; you give the fresh values" in body
    before = snapshot(task)

    # a hand-made POST is refused by the service, as a message
    response = client.post(
        f"{DESK}{task.pk}/resolve/",
        {"resolution": "approve", "operation_id": str(operation.pk)},
        follow=True,
    )

    assert messages_of(response) == [
        "Not approved: for FIELD_STALE the same input would be refused again. "
        "Edit the fields (fresh values with their source and read time) or hand "
        "the task back for a fresh read."
    ]
    assert snapshot(task) == before
    assert not Approval.objects.filter(operation_id=operation.pk).exists()


def test_hand_back_asks_what_to_read_again(world: World, claimed):
    task, operation, client = claimed
    before = snapshot(task)
    body = client.get(page(task)).content.decode()
    assert 'placeholder="what should the agent read again?"' in body

    refused = client.post(
        f"{DESK}{task.pk}/resolve/",
        {"resolution": "hand_back", "operation_id": str(operation.pk)},
        follow=True,
    )
    assert messages_of(refused) == [
        "Not resolved: note: hand back needs a note: what should the agent read again?"
    ]
    assert snapshot(task) == before

    response = client.post(
        f"{DESK}{task.pk}/resolve/",
        {
            "resolution": "hand_back",
            "operation_id": str(operation.pk),
            "note": "read the e-mail from the CRM again",
        },
        follow=True,
    )
    assert messages_of(response) == [
        "Resolved: hand back. The agent reads again and executes under the same key."
    ]
    assert Task.objects.get(pk=task.pk).state == TaskState.PENDING
    resolved = Event.objects.get(task_id=task.pk, code=EventCode.TASK_RESOLVED)
    assert resolved.payload["note"] == "read the e-mail from the CRM again"
    assert world.tickets() == 0  # the agent's next execute makes the call
    assert resolved.payload["resolution"] == "hand_back"
    assert Escalation.objects.get(task_id=task.pk).resolution == "hand_back"


@pytest.mark.django_db
def test_approve_is_offered_and_works_for_approval_required(
    make_task, make_operation, tenant
):
    # Given a task whose connector needs a person to approve the exact input
    task = make_task(state=TaskState.RUNNING, leased=True, client_task_id="issue-9")
    operation = make_operation(task=task, state=OperationState.UNKNOWN)
    with transaction.atomic():
        escalation.escalate(
            tenant=tenant,
            task=task,
            operation=operation,
            reason="APPROVAL_REQUIRED",
            evidence={"input": {"queue": "billing"}},
            actor=Actor.system("test"),
        )
    sam = make_person("sam", {tenant: Role.SUPPORT})
    client = as_(sam)
    client.post(f"{DESK}{task.pk}/claim/")

    body = client.get(page(task)).content.decode()
    options = re.findall(r'<option value="([a-z_]+)">', body)
    assert "approve" in options
    assert "Approve as is</strong> &mdash; Run the same input once more" in body
    assert 'id="desk-no-approve"' not in body

    response = client.post(
        f"{DESK}{task.pk}/resolve/",
        {"resolution": "approve", "operation_id": str(operation.pk)},
        follow=True,
    )
    assert messages_of(response) == ["Resolved: approve."]
    approval = Approval.objects.get(operation_id=operation.pk)
    assert approval.approved_by_id == sam.pk
    assert Task.objects.get(pk=task.pk).state == TaskState.PENDING


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        (
            ["reject"],
            "The remote system ticket-desk rejected the call: the operation failed",
        ),
        (
            ["error_5xx", "lookup_5xx"],
            "The call's outcome is in doubt (RESULT_UNKNOWN): the gateway looks",
        ),
    ],
)
def test_an_edit_the_ticket_desk_does_not_confirm_is_a_message_and_stays_with_you(
    world: World, claimed, sam, faults, message
):
    task, operation, client = claimed
    for fault in faults:
        world.desk.set_fault(fault)

    response = client.post(f"{DESK}{task.pk}/edit/", edit_post(operation), follow=True)

    assert response.status_code == 200
    (shown,) = messages_of(response)
    assert shown.startswith(message), shown
    assert shown.endswith("the task stays with you.")
    current = Task.objects.get(pk=task.pk)
    assert (current.state, current.lease_owner) == (
        TaskState.HUMAN_CLAIMED,
        f"user:{sam.pk}",
    )
    assert Operation.objects.get(pk=operation.pk).state != OperationState.VERIFIED


def test_sealed_values_that_do_not_open_leave_every_row_asked(world: World, claimed):
    # Given the operation's sealed values were sealed under another secret
    task, operation, client = claimed
    other = "v1:" + base64.b64encode(os.urandom(60)).decode()
    Operation.objects.filter(pk=operation.pk).update(sealed=other)

    # Then the page still answers, asking for every field, and keeps nothing
    response = client.get(page(task))
    assert response.status_code == 200
    rows = re.findall(
        r'<tr data-field="([^"]+)" class="([^"]+)">', response.content.decode()
    )
    assert rows == [("email", "desk-asked"), ("plan", "desk-asked")]
