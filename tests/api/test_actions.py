"""POST /api/v1/actions: one governed action in one call, against the real desk.

The world (contract, connector, grant, key) is the gateway tier's, reached over real
HTTP through pytest-django's live server; the ticket desk is a real process on
127.0.0.1, and "one ticket" is counted in its own ledger.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import connection

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.actors import Actor
from portal.db import db_now
from portal.models import Role, Tenant
from tasks import actions, takeover
from tasks import services as task_services
from tasks.gateway import operation_run_queued
from tasks.jobs import check_receipts_job
from tasks.models import Escalation, Operation, Task
from tests.gateway.conftest import World, make_world
from tests.support.concurrency import run_in_threads
from tests.support.contracts import SPEC, TARGET
from tests.support.statements import label, statements
from ticketdesk.harness import TicketDesk

pytestmark = pytest.mark.django_db(transaction=True)


KEY = "ticket-for-issue-1042"


@pytest.fixture
def world(
    transactional_db: None,
    live_server: Any,
    desk: TicketDesk,
    tenant: Tenant,
    make_agent: Any,
) -> Iterator[World]:
    yield from make_world(
        tenant=tenant, make_agent=make_agent, desk=desk, base_url=live_server.url
    )


def body(
    *,
    key: str = KEY,
    email_age: dt.timedelta = dt.timedelta(0),
    n: int = 1042,
    **overrides: Any,
) -> dict[str, Any]:
    """One action: a ticket for issue ``n``, with the fields read just now."""
    now = db_now()
    return {
        "action": "create_ticket",
        "target": TARGET,
        "object_type": "customer_issue",
        "object_id": str(n),
        "object_version": "7",
        "fields": {
            "email": {
                "value": "ana@example.com",
                "source": "crm",
                "read_at": (now - email_age).isoformat(),
            },
            "plan": {"value": "pro", "source": "billing", "read_at": now.isoformat()},
        },
        "arguments": {"queue": "billing", "summary": f"Refund {n}", "customer": "ana"},
        "idempotency_key": key,
        **overrides,
    }


def take(world: World, data: dict[str, Any], **headers: str) -> httpx.Response:
    return world.http.post("/api/v1/actions", json=data, headers=headers)


@pytest.fixture
def current(world: World) -> None:
    """The object's recorded version is the one the body read (the version fence)."""
    portal_services_record(world, "1042", "7")


def portal_services_record(world: World, object_id: str, version: str) -> None:
    response = world.http.put(
        f"/api/v1/object-versions/customer_issue/{object_id}",
        json={"version": version},
    )
    assert response.status_code == 200, response.text


def test_one_call_verifies_with_the_receipt_and_makes_one_ticket(world, current):
    response = take(world, body())
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["status"] == "verified"
    assert answer["provider_reference"]  # the desk's ticket id
    assert answer["created"] is True
    assert answer["status_url"] == f"/api/v1/operations/{answer['operation_id']}"
    assert world.tickets(key=KEY) == world.tickets() == 1
    task = Task.objects.get(pk=answer["task_id"])
    assert (task.state, task.lease_owner) == ("succeeded", None)
    assert task.client_task_id == actions.client_task_id_for(KEY)
    assert Operation.objects.get(pk=answer["operation_id"]).idempotency_key == KEY


# The statements of one call with a new key, in the calling process (the desk's own
# are its process's): the grant with the key's operation; the task registered and
# claimed; the reservation; the gateway's checks, credentials and call start; the
# call's record; the task settled. A statement more is latency on every action.
ONE_CALL_MAX_STATEMENTS = 36


def test_one_call_runs_at_most_its_budget_of_statements(world, current):
    """Counted in this process, around the service the endpoint calls, on the second
    action (the first warmed the caches): every statement the action sends, not
    the key check and idempotency record of its HTTP request."""
    portal_services_record(world, "1043", "7")
    fields = {
        name: actions.FieldRead(
            value=read["value"],
            source=read["source"],
            read_at=dt.datetime.fromisoformat(read["read_at"]),
        )
        for name, read in body()["fields"].items()
    }

    def request(n: int) -> actions.ActionRequest:
        data = body(key=f"ticket-{n}", n=n)
        return actions.ActionRequest(
            action=data["action"],
            target=data["target"],
            object_type=data["object_type"],
            object_id=data["object_id"],
            object_version=data["object_version"],
            fields=fields,
            arguments=data["arguments"],
            idempotency_key=data["idempotency_key"],
        )

    assert actions.action_take(agent=world.agent, request=request(1042)).status == (
        "verified"
    )
    second = request(1043)  # built outside: body() reads the database clock
    with statements() as seen:
        outcome = actions.action_take(agent=world.agent, request=second)
    assert outcome.status == "verified", outcome
    labels = [label(sql) for sql in seen]
    assert len(labels) <= ONE_CALL_MAX_STATEMENTS, (len(labels), labels)
    assert world.tickets() == 2


def test_the_same_call_again_answers_the_same_operation_and_calls_nobody(
    world, current
):
    first = take(world, body()).json()
    again = take(world, body())  # fields read again: a later read time
    assert again.status_code == 200
    assert again.json()["operation_id"] == first["operation_id"]
    assert again.json()["status"] == "verified"
    assert again.json()["created"] is False
    assert world.tickets() == 1
    assert world.desk.effects()["create_requests"] == 1


def test_the_same_idempotency_key_header_replays_the_stored_answer(world, current):
    data = body()
    first = take(world, data, **{"Idempotency-Key": "req-1"})
    replay = take(world, data, **{"Idempotency-Key": "req-1"})
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()
    other = take(world, body(n=7), **{"Idempotency-Key": "req-1"})
    assert other.status_code == 422
    assert other.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"


@pytest.mark.parametrize(
    "change",
    [
        {"arguments": {"queue": "billing", "summary": "Other", "customer": "ana"}},
        {"object_id": "1043"},
        {"object_version": "8"},
        {"target": "ticket-desk-2"},
    ],
    ids=["arguments", "object", "version", "target"],
)
def test_another_action_under_the_same_key_is_refused_and_nothing_runs(
    world, current, change
):
    portal_services.agent_grant(agent=world.agent, action="create_ticket", target="*")
    first = take(world, body()).json()
    refused = take(world, {**body(), **change})
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert world.desk.effects()["create_requests"] == 1
    assert Task.objects.filter(tenant=world.tenant).count() == 1
    assert Operation.objects.get(pk=first["operation_id"]).state == "verified"


def test_a_stale_field_is_refused_with_the_field_and_a_desk_item(world, current):
    response = take(world, body(email_age=dt.timedelta(minutes=10)))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["status"] == "refused"
    assert answer["reason_code"] == "FIELD_STALE"
    assert answer["failed_check"] == "fields"
    assert answer["failed_fields"] == ["email"]
    assert answer["details"]["conflicting_fields"][0]["max_age_s"] == 300
    assert "do not retry with a new key" in answer["next_step"].lower()
    escalation = Escalation.objects.get(pk=answer["desk_item_id"])
    assert escalation.reason_code == "FIELD_STALE"
    assert Task.objects.get(pk=answer["task_id"]).state == "human_required"
    assert world.tickets() == 0
    # Asked again (a fresh read), the answer is the same; still no call.
    again = take(world, body()).json()
    assert again == {**answer, "created": False}
    assert world.tickets() == 0


def test_a_dropped_answer_is_unknown_then_recovery_and_the_same_call_settle_it(
    world, current
):
    world.desk.set_fault("execute_then_drop")  # the ticket is made, its answer lost
    world.desk.set_fault("lookup_5xx")  # and the first look cannot tell
    response = take(world, body())
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["status"] == "unknown"
    assert response.headers["Location"] == answer["status_url"]
    assert "do not retry with a new key" in answer["next_step"].lower()
    assert Task.objects.get(pk=answer["task_id"]).lease_owner is None  # given back
    # The portal's recovery looks the receipt up by key.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    assert check_receipts_job() == 1
    polled = world.http.get(answer["status_url"]).json()
    assert polled["state"] == "verified"
    # The same call settles the task; the desk sees no second create.
    settled = take(world, body()).json()
    assert (settled["status"], settled["operation_id"]) == (
        "verified",
        answer["operation_id"],
    )
    assert Task.objects.get(pk=answer["task_id"]).state == "succeeded"
    assert world.tickets() == 1
    assert world.desk.effects()["create_requests"] == 1


def test_eight_concurrent_callers_with_one_key_make_one_ticket(world, current):
    barrier = threading.Barrier(8, timeout=10)

    def call() -> dict[str, Any]:
        barrier.wait()
        for _ in range(100):  # what portal_client does on 409 REQUEST_IN_FLIGHT
            response = take(world, body())
            if response.status_code != 409:
                return {**response.json(), "http": response.status_code}
            assert response.json()["code"] == "REQUEST_IN_FLIGHT"
            assert int(response.headers["Retry-After"]) >= 1
            threading.Event().wait(0.05)
        raise AssertionError("still in flight")

    answers = run_in_threads(*[call] * 8)
    assert not [a for a in answers if isinstance(a, BaseException)], answers
    assert {a["operation_id"] for a in answers} == {answers[0]["operation_id"]}
    assert {(a["http"], a["status"], a["provider_reference"]) for a in answers} == {
        (200, "verified", answers[0]["provider_reference"])
    }
    assert sum(a["created"] for a in answers) == 1
    assert world.tickets() == 1
    assert world.desk.effects()["create_requests"] == 1
    assert Task.objects.filter(tenant=world.tenant).count() == 1


def test_an_agent_without_the_grant_is_refused_before_anything_is_written(
    world, current, make_agent
):
    stranger = make_agent(tenant=world.tenant, grants=())
    secret = portal_services.agent_key_issue(agent=stranger).secret
    response = world.http.post(
        "/api/v1/actions",
        json=body(),
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert response.status_code == 403
    assert response.json()["code"] == "ACTION_NOT_GRANTED"
    assert not Task.objects.filter(tenant=world.tenant).exists()
    assert world.desk.effects()["create_requests"] == 0


def test_a_target_the_contract_does_not_list_goes_to_a_person(world, current):
    portal_services.agent_grant(agent=world.agent, action="create_ticket", target="*")
    response = take(world, body(target="crm", contract_key="customer-issue"))
    answer = response.json()
    assert (answer["status"], answer["reason_code"], answer["failed_check"]) == (
        "refused",
        "TARGET_FORBIDDEN",
        "target",
    )
    assert answer["desk_item_id"]
    assert world.desk.effects()["create_requests"] == 0


def test_another_tenants_agent_never_reaches_this_tenants_action(
    world, current, other_tenant, make_agent
):
    first = take(world, body()).json()
    outsider = make_agent(tenant=other_tenant, grants=())
    portal_services.agent_grant(agent=outsider, action="create_ticket", target=TARGET)
    secret = portal_services.agent_key_issue(agent=outsider).secret
    response = world.http.post(
        "/api/v1/actions",
        json=body(),  # the same key, in its own tenant: no contract there
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert response.status_code == 404, response.text
    assert response.json()["code"] == "NOT_FOUND"
    assert first["operation_id"] not in response.text
    assert world.tickets() == 1
    assert not Task.objects.filter(tenant=other_tenant).exists()


def test_respond_async_answers_202_and_a_worker_makes_the_call(world, current):
    response = take(world, body(), Prefer="respond-async")
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["status"] == "accepted"
    assert response.headers["Location"] == answer["status_url"]
    assert world.tickets() == 0
    again = take(world, body()).json()  # asked again before the worker ran
    assert (again["status"], again["operation_id"]) == (
        "accepted",
        answer["operation_id"],
    )
    operation_run_queued(tenant=world.tenant, operation_id=answer["operation_id"])
    settled = take(world, body()).json()
    assert settled["status"] == "verified"
    assert Task.objects.get(pk=answer["task_id"]).state == "succeeded"
    assert world.tickets() == 1


def test_a_person_hands_the_task_back_and_the_same_call_makes_the_ticket(
    world, current
):
    refused = take(world, body(email_age=dt.timedelta(minutes=10))).json()
    task = Task.objects.get(pk=refused["task_id"])
    sam = User.objects.create_user("sam", password="pw-for-tests-only-1")
    portal_services.membership_grant(tenant=world.tenant, user=sam, role=Role.SUPPORT)
    takeover.task_human_claim(task=task, user=sam)
    takeover.task_human_resolve(task=task, user=sam, resolution="hand_back")
    answer = take(world, body()).json()  # the e-mail read again, fresh
    assert (answer["status"], answer["operation_id"]) == (
        "verified",
        refused["operation_id"],
    )
    assert Task.objects.get(pk=task.pk).state == "succeeded"
    assert world.tickets() == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"target": None}, "target"),
        ({"tenant_id": "x"}, "tenant_id"),
        ({"fields": {"email": {"value": 1, "source": "crm"}}}, "fields"),
        ({"arguments": {"n": 2**60}}, "arguments"),
        ({"idempotency_key": "k" * 201}, "idempotency_key"),
        ({"object_version": 7}, "object_version"),
    ],
    ids=["missing", "unknown-member", "no-read-time", "unsafe-number", "long", "type"],
)
def test_bad_input_is_a_400_that_names_the_field(world, change, field):
    data = {**body(), **change}
    data = {name: value for name, value in data.items() if value is not None}
    response = take(world, data)
    assert response.status_code == 400, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert field in response.json()["errors"]
    assert not Task.objects.filter(tenant=world.tenant).exists()


def test_a_malformed_or_oversized_body_is_a_400_or_413_problem(world):
    broken = world.http.post(
        "/api/v1/actions",
        content=b'{"action": ',
        headers={"Content-Type": "application/json"},
    )
    assert broken.status_code == 400
    assert broken.json()["code"] == "MALFORMED_REQUEST"
    huge = world.http.post(
        "/api/v1/actions",
        content=b'{"arguments": "' + b"x" * 3_000_000 + b'"}',
        headers={"Content-Type": "application/json"},
    )
    assert huge.status_code == 413
    assert huge.json()["code"] == "REQUEST_TOO_LARGE"


def test_the_events_tell_the_whole_story_once(world, current):
    answer = take(world, body()).json()
    codes = list(
        Event.objects.filter(task_id=answer["task_id"])
        .order_by("id")
        .values_list("code", flat=True)
    )
    assert codes.count(EventCode.OPERATION_VERIFIED) == 1
    # Registered and claimed in one transaction: no lease acquired, no move to
    # running of its own.
    assert codes[:2] == [EventCode.TASK_REGISTERED, EventCode.TASK_CLAIMED]
    assert EventCode.TASK_LEASE_ACQUIRED not in codes
    assert codes.count(EventCode.TASK_TRANSITIONED) == 1
    assert codes[-1] == EventCode.TASK_TRANSITIONED  # running -> succeeded


def test_a_retry_keeps_the_contract_version_its_first_call_pinned(world, current):
    # given the task a first call registered under the contract's version 1 (it
    # stopped before reserving), and a version 2 published since
    task_services.task_register(
        tenant=world.tenant,
        actor=Actor.of_agent(world.agent),
        client_task_id=actions.client_task_id_for(KEY),
        workflow_key="create_ticket",
        workflow_version="1",
        object_type="customer_issue",
        object_id="1042",
        object_version="7",
        contract_key=world.contract.key,
        contract_version=world.contract.version,
    )
    task_services.contract_create(
        tenant=world.tenant, key=world.contract.key, spec=SPEC, publish=True
    )
    # when the same call is made again, naming no version
    answer = take(world, body())
    # then it finishes that task under the version it pinned, not a new one
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "verified"
    task = Task.objects.get(pk=answer.json()["task_id"])
    assert (task.client_task_id, task.contract_version) == (
        actions.client_task_id_for(KEY),
        world.contract.version,
    )
