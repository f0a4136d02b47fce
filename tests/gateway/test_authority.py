"""Authority (issue 10 §2): whose grant lets a call happen, who may say how it ended,
and what a credential that expires mid-call comes to.

Against a real ticket desk on 127.0.0.1 over the real agent API; the desk's own
ticket count is the evidence that a call did or did not happen.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from audit.models import Event
from portal import services as portal_services
from portal.models import Agent, Role
from tasks import services as task_services
from tasks import takeover
from tasks.jobs import run_operation_job
from tasks.models import Connector, Credential, Escalation, Operation, Task
from tests.support.contracts import SPEC, TARGET

from .conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def client_for(world: World, agent: Agent) -> httpx.Client:
    secret = portal_services.agent_key_issue(agent=agent).secret
    return httpx.Client(
        base_url=world.http.base_url,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )


@pytest.fixture
def stranger(world: World, make_agent: Any) -> Iterator[tuple[Agent, httpx.Client]]:
    """A second agent of the same tenant, with no grant at all."""
    agent = make_agent(tenant=world.tenant, grants=())
    with client_for(world, agent) as http:
        yield agent, http


def take_over_lease(world: World, started: dict, http: httpx.Client) -> int:
    """The first agent gives its lease back; another agent takes the task."""
    task_id = started["task"]["id"]
    released = world.http.post(
        f"/api/v1/tasks/{task_id}/lease/release",
        headers={"Lease-Token": str(started["token"])},
    )
    assert released.status_code == 200, released.text
    leased = http.post(f"/api/v1/tasks/{task_id}/lease", json={"owner": "other"})
    assert leased.status_code == 200, leased.text
    return int(leased.json()["lease"]["token"])


def execute_as(
    world: World, http: httpx.Client, started: dict, token: int, **headers: str
) -> httpx.Response:
    return http.post(
        f"/api/v1/operations/{started['operation']['id']}/execute",
        json={"field_values": world.fields()},
        headers={"Lease-Token": str(token), **headers},
    )


def operation(started: dict) -> Operation:
    return Operation.objects.get(pk=started["operation"]["id"])


def events(started: dict, code: str) -> list[Event]:
    return list(
        Event.objects.filter(operation_id=started["operation"]["id"], code=code)
    )


# --- The confused deputy: the caller's own grant --------------------------------------


def test_an_agent_without_a_grant_cannot_execute_another_agents_operation(
    world: World, stranger: tuple[Agent, httpx.Client]
):
    # given: agent A reserved; agent B, with no grant, holds the task's lease now
    started = world.start_task()
    _, http = stranger
    token = take_over_lease(world, started, http)

    # when: B executes A's reserved operation
    response = execute_as(world, http, started, token)

    # then: refused as at reserve, nothing called, nothing changed
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "ACTION_NOT_GRANTED"
    assert world.tickets() == 0
    assert (operation(started).state, operation(started).state_version) == (
        "reserved",
        1,
    )
    assert events(started, "gateway.checked") == []
    assert not Credential.objects.filter(
        operation_id=started["operation"]["id"]
    ).exists()


def test_an_agent_without_a_grant_cannot_queue_another_agents_operation(
    world: World, stranger: tuple[Agent, httpx.Client]
):
    started = world.start_task()
    _, http = stranger
    token = take_over_lease(world, started, http)
    response = execute_as(world, http, started, token, Prefer="respond-async")
    assert response.status_code == 403, response.text
    assert operation(started).authorized_at is None
    assert world.tickets() == 0


def test_an_agent_with_its_own_grant_executes_and_is_recorded_as_executor(
    world: World, stranger: tuple[Agent, httpx.Client]
):
    # given: B holds a grant of its own and takes over A's task
    started = world.start_task()
    agent_b, http = stranger
    portal_services.agent_grant(agent=agent_b, action="create_ticket", target=TARGET)
    token = take_over_lease(world, started, http)

    response = execute_as(world, http, started, token)

    # then: verified; the operation and the trail name B as the executor
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "verified"
    assert world.tickets() == 1
    done = operation(started)
    assert done.agent_id == world.agent.pk  # who reserved
    assert done.executed_by_agent_id == agent_b.pk  # who executed
    for code in ("gateway.checked", "operation.executing", "connector.called"):
        assert {e.actor_id for e in events(started, code)} == {str(agent_b.pk)}, code


def test_a_queued_run_rechecks_the_grant_of_the_agent_that_queued_it(
    world: World, stranger: tuple[Agent, httpx.Client]
):
    # given: B queues A's operation under B's own grant, then loses that grant
    started = world.start_task()
    agent_b, http = stranger
    portal_services.agent_grant(agent=agent_b, action="create_ticket", target=TARGET)
    token = take_over_lease(world, started, http)
    queued = execute_as(world, http, started, token, Prefer="respond-async")
    assert queued.status_code == 202, queued.text
    assert operation(started).executed_by_agent_id == agent_b.pk
    portal_services.agent_grant_revoke(
        agent=agent_b, action="create_ticket", target=TARGET
    )

    # when: the worker runs it (A's grant still holds; it does not count)
    run_operation_job.run(
        tenant_id=str(world.tenant.pk), operation_id=started["operation"]["id"]
    )

    # then: no call; a person gets it with the reason
    assert (operation(started).state, operation(started).reason_code) == (
        "human_required",
        "PERMISSION_REVOKED",
    )
    assert world.tickets() == 0
    escalation = Escalation.objects.get(operation_id=started["operation"]["id"])
    assert escalation.evidence["agent_id"] == str(agent_b.pk)


def test_reserving_is_refused_to_a_caller_without_a_grant_even_for_a_known_key(
    world: World, stranger: tuple[Agent, httpx.Client]
):
    started = world.start_task()
    _, http = stranger
    token = take_over_lease(world, started, http)
    response = http.post(
        f"/api/v1/tasks/{started['task']['id']}/operations",
        json={
            "idempotency_key": started["operation"]["idempotency_key"],
            "action": "create_ticket",
            "target": TARGET,
            "input": {
                "queue": "billing",
                "summary": "Refund for issue 1042",
                "customer": "ana",
            },
        },
        headers={"Lease-Token": str(token)},
    )
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "ACTION_NOT_GRANTED"


# --- Self-reported outcomes ------------------------------------------------------------


def test_start_and_outcome_are_refused_on_a_gateway_governed_target(world: World):
    started = world.start_task()
    op_id = started["operation"]["id"]
    lease = {"Lease-Token": str(started["token"])}

    start = world.http.post(f"/api/v1/operations/{op_id}/start", headers=lease)
    forged = world.http.post(
        f"/api/v1/operations/{op_id}/outcome",
        json={"outcome": "verified", "provider_reference": "TCK-FORGED"},
        headers=lease,
    )

    for response in (start, forged):
        assert response.status_code == 409, response.text
        assert response.json()["code"] == "GATEWAY_GOVERNED"
        assert response.headers["content-type"].startswith("application/problem+json")
    assert (operation(started).state, operation(started).state_version) == (
        "reserved",
        1,
    )
    assert operation(started).provider_reference is None
    assert events(started, "operation.executing") == []
    # the gateway still executes it afterwards
    assert world.execute(started).json()["outcome"] == "verified"
    assert world.tickets() == 1


def self_reported_task(world: World, target: str) -> dict:
    """A running task whose operation addresses a target with no connector."""
    portal_services.agent_grant(agent=world.agent, action="send_note", target=target)
    started = world.start_task()
    reserved = world.http.post(
        f"/api/v1/tasks/{started['task']['id']}/operations",
        json={
            "idempotency_key": f"note-{target}",
            "action": "send_note",
            "target": target,
            "input": {"note": "hello"},
        },
        headers={"Lease-Token": str(started["token"])},
    )
    assert reserved.status_code == 201, reserved.text
    return {**started, "operation": reserved.json()}


def test_a_target_without_a_connector_keeps_the_self_reported_flow(world: World):
    started = self_reported_task(world, "crm-notes")
    op_id = started["operation"]["id"]
    lease = {"Lease-Token": str(started["token"])}
    start = world.http.post(f"/api/v1/operations/{op_id}/start", headers=lease)
    assert start.status_code == 200, start.text
    done = world.http.post(
        f"/api/v1/operations/{op_id}/outcome",
        json={"outcome": "verified", "provider_reference": "NOTE-1"},
        headers=lease,
    )
    assert done.status_code == 200, done.text
    assert operation(started).state == "verified"


def test_start_and_outcome_never_move_an_operation_waiting_for_a_person(
    world: World,
):
    # given: an operation on a target without a connector went to a person
    # (human_required), who handed the task back to the agent
    started = self_reported_task(world, "crm-notes")
    op_id = started["operation"]["id"]
    refused = world.execute(started)
    assert refused.json()["code"] == "TARGET_FORBIDDEN"
    assert operation(started).state == "human_required"
    sam = User.objects.create_user("sam", password="pw-for-tests-only-1")
    portal_services.membership_grant(tenant=world.tenant, user=sam, role=Role.SUPPORT)
    task = Task.objects.get(pk=started["task"]["id"])
    takeover.task_human_claim(task=task, user=sam)
    takeover.task_human_resolve(task=task, user=sam, resolution="hand_back", note="x")
    leased = world.http.post(
        f"/api/v1/tasks/{task.pk}/lease", json={"owner": "worker-1"}
    ).json()
    lease = {"Lease-Token": str(leased["lease"]["token"])}

    # when: the agent starts it, or reports it verified, itself
    start = world.http.post(f"/api/v1/operations/{op_id}/start", headers=lease)
    forged = world.http.post(
        f"/api/v1/operations/{op_id}/outcome",
        json={"outcome": "verified", "provider_reference": "NOTE-FORGED"},
        headers=lease,
    )

    # then: neither moves it past the person
    for response in (start, forged):
        assert response.status_code == 409, response.text
        assert response.json()["code"] == "ILLEGAL_TRANSITION"
    assert operation(started).state == "human_required"


# --- A credential that expires mid-call ----------------------------------------------


@pytest.fixture
def short_credentials(world: World) -> World:
    """Credentials live 1 s (a new contract version); the desk may take 2.5 s."""
    spec: dict[str, Any] = copy.deepcopy(SPEC)
    spec["policy"]["credential_ttl_s"] = 1
    task_services.contract_create(
        tenant=world.tenant, key="customer-issue", spec=spec, publish=True
    )
    Connector.objects.filter(tenant=world.tenant, target=TARGET).update(
        read_timeout_s=6.0
    )
    return world


def test_a_credential_expired_mid_call_is_retried_once_with_a_fresh_one(
    short_credentials: World,
):
    world = short_credentials
    started = world.start_task()
    world.desk.set_fault("slow", delay_s=2.5)  # the first call only

    response = world.execute(started)

    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "verified"
    assert world.tickets() == 1
    done = operation(started)
    assert done.attempts == 2
    issued = [
        credential
        for event in events(started, "operation.executing")
        for credential in event.payload["issued"]
    ]
    # Each call: one execute credential and one for its confirming lookup, recorded
    # in the executing event of the call that carries them.
    assert sorted(c["use"] for c in issued) == [
        "execute",
        "execute",
        "lookup",
        "lookup",
    ]
    assert {c["credential_id"] for c in issued} == {
        str(pk)
        for pk in Credential.objects.filter(
            operation_id=started["operation"]["id"]
        ).values_list("pk", flat=True)
    }
    expired = events(started, "operation.unknown")
    assert [e.reason_code for e in expired] == ["CREDENTIAL_EXPIRED"]
    assert {
        e.payload["idempotency_key"] for e in events(started, "operation.executing")
    } == {started["operation"]["idempotency_key"]}


def test_a_credential_that_keeps_expiring_goes_to_a_person_with_evidence(
    short_credentials: World, settings: Any
):
    world = short_credentials
    settings.PORTAL_CREDENTIAL_EXPIRED_RETRIES = 1
    started = world.start_task()
    world.desk.set_fault("slow", times=0, delay_s=2.5)  # every call is slow

    response = world.execute(started)

    assert response.status_code == 422, response.text
    assert response.json()["code"] == "CREDENTIAL_EXPIRED"
    assert world.tickets() == 0
    done = operation(started)
    assert (done.state, done.reason_code, done.attempts) == (
        "human_required",
        "CREDENTIAL_EXPIRED",
        2,
    )
    task = Task.objects.get(pk=started["task"]["id"])
    assert (task.state, task.reason_code) == ("human_required", "CREDENTIAL_EXPIRED")
    escalation = Escalation.objects.get(operation_id=done.pk)
    evidence = escalation.evidence
    assert evidence["attempts"] == 2
    assert evidence["ttl_s"] == 1  # "credential" keys are redacted
    assert len(evidence["calls"]) == 2
    assert all(call["status"] == 401 for call in evidence["calls"])
