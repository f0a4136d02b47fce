"""The seed's test matrix, end to end: agent API over real HTTP, the gateway, and a
real ticket desk on 127.0.0.1 whose own count of tickets is the evidence.

Each case asserts the desk's ticket count (never a duplicate), the final task and
operation states, the reason code and the events written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection

from audit.models import Event
from portal import services as portal_services
from portal.actors import Actor
from portal.models import Role
from tasks import gateway, services, takeover
from tasks.credentials import body_digest, credential_mint, request_body
from tasks.exceptions import AlreadyClaimed, ApprovalRepeatsRefusal
from tasks.jobs import check_receipts_job
from tasks.models import Escalation, Operation, OperationState, Task, TaskState
from tests.support.checks import check_entries
from tests.support.concurrency import run_in_threads

from .conftest import World, minutes_ago

pytestmark = pytest.mark.django_db(transaction=True)


def refused(response, reason: str) -> dict:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == reason
    assert body["task_state"] == "human_required"
    return body


def state_of(started: dict) -> tuple[str, str, str | None]:
    task = Task.objects.get(pk=started["task"]["id"])
    operation = Operation.objects.get(pk=started["operation"]["id"])
    return task.state, operation.state, task.reason_code


def checks_of(started: dict) -> list[tuple[str, str]]:
    return [
        (entry["check"], entry["verdict"])
        for entry in check_entries(started["operation"]["id"])
    ]


def field_gateway_values(world: World, **overrides) -> list[gateway.FieldValue]:
    import datetime as dt

    return [
        gateway.FieldValue(
            name=item["name"],
            value=item["value"],
            source=item["source"],
            observed_at=dt.datetime.fromisoformat(item["observed_at"]),
        )
        for item in world.fields(**overrides)
    ]


def test_the_happy_path_makes_one_verified_ticket(world: World):
    started = world.start_task()
    response = world.execute(started)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["outcome"] == "verified"
    ticket = world.desk.tickets()[0]
    assert body["operation"]["provider_reference"] == ticket["ticket_id"]
    assert world.tickets() == 1
    assert checks_of(started) == [
        ("contract", "passed"),
        ("fields", "passed"),
        ("target", "passed"),
        ("permission", "passed"),
        ("version", "passed"),
        ("credential", "passed"),
    ]
    # Only the contract's read_fields travel; "plan" was checked but not passed on.
    assert ticket.get("fields") == {"email": "ana@example.com"}
    again = world.execute(started)  # idempotent: reports, never calls again
    assert again.json()["outcome"] == "verified"
    assert world.tickets() == 1


# --- 1. Required field missing, wrong source, stale ----------------------------------


@pytest.mark.parametrize(
    ("field", "change", "reason"),
    [
        ("email", "drop", "FIELD_MISSING"),
        ("email", {"source": "guess"}, "FIELD_SOURCE_MISMATCH"),
        ("email", 10, "FIELD_STALE"),  # minutes old; the contract allows 5
        ("plan", 90, "FIELD_STALE"),  # the contract allows 60
    ],
)
def test_1_bad_fields_are_refused_before_any_call(world: World, field, change, reason):
    started = world.start_task()
    if change == "drop":
        change = None
    elif isinstance(change, int):
        change = {"observed_at": minutes_ago(change)}
    body = refused(world.execute(started, world.fields(**{field: change})), reason)
    assert world.tickets() == 0
    assert state_of(started) == ("human_required", "human_required", reason)
    escalation = Escalation.objects.get(pk=body["escalation_id"])
    assert escalation.evidence["plan"]["idempotency_key"] == "ticket-for-issue-1042"
    assert escalation.evidence["conflicting_fields"][0]["problem"] == reason
    assert checks_of(started)[-1] == ("fields", "refused")


# --- 2. Contract version upgraded, then an old task recovers -------------------------


def test_2_an_old_task_recovers_under_its_pinned_contract(world: World):
    started = world.start_task()
    world.desk.set_fault("execute_then_drop")
    world.desk.set_fault("lookup_5xx")  # the first look cannot tell
    first = world.execute(started)
    assert first.json()["outcome"] == "unknown"
    # A new contract version is published and the old one retired meanwhile.
    services.contract_create(
        tenant=world.tenant,
        key="customer-issue",
        spec=world.contract.spec,
        publish=True,
    )
    services.contract_retire(tenant=world.tenant, key="customer-issue", version=1)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    assert check_receipts_job() == 1
    # The call did happen: the pinned (retired) version still allows settling it.
    assert state_of(started)[1] == "verified"
    assert world.tickets() == 1


def test_2_a_retired_contract_allows_no_new_write(world: World):
    started = world.start_task()
    services.contract_retire(tenant=world.tenant, key="customer-issue", version=1)
    refused(world.execute(started), "CONTRACT_RETIRED")
    assert world.tickets() == 0


def test_2_no_retry_under_a_retired_contract(world: World):
    started = world.start_task()
    world.desk.set_fault("error_5xx")  # nothing happened, but the answer is unclear
    world.desk.set_fault("lookup_5xx")
    assert world.execute(started).json()["outcome"] == "unknown"
    services.contract_retire(tenant=world.tenant, key="customer-issue", version=1)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    check_receipts_job()  # the lookup now says: no ticket; retrying is not allowed
    assert state_of(started) == ("human_required", "human_required", "CONTRACT_RETIRED")
    assert world.tickets() == 0


# --- 3. Object version changes between validation and write --------------------------


def test_3_a_version_change_before_the_check_is_refused(world: World):
    started = world.start_task()
    world.http.put("/api/v1/object-versions/customer_issue/1042", json={"version": "8"})
    body = refused(world.execute(started), "VERSION_CONFLICT")
    evidence = Escalation.objects.get(pk=body["escalation_id"]).evidence
    assert (evidence["version_read"], evidence["current_version"]) == ("7", "8")
    # seed 004: plan, current version, conflicting fields and responsible owner
    assert (
        evidence["plan"]["idempotency_key"] == started["operation"]["idempotency_key"]
    )
    assert {f["field"] for f in evidence["conflicting_fields"]} == {"email", "plan"}
    assert all(f["read_at_version"] == "7" for f in evidence["conflicting_fields"])
    assert "ana@example.com" not in str(evidence)  # names and times, not values
    assert evidence["responsible_owner"] == "worker-1"
    assert world.tickets() == 0
    task = Task.objects.get(pk=started["task"]["id"])
    assert task.object_version == "7"  # never bumped to continue


def test_3_a_version_change_between_validation_and_write_is_refused(world: World):
    started = world.start_task()

    def change_the_object(point: str) -> None:
        if point == "before_call":  # after every check passed and committed
            services.object_version_record(
                tenant=world.tenant,
                object_type="customer_issue",
                object_id="1042",
                version="8",
            )

    result = gateway.operation_execute(
        tenant=world.tenant,
        operation_id=started["operation"]["id"],
        lease_token=started["token"],
        fields=field_gateway_values(world),
        actor=Actor.of_agent(world.agent),
        _test_hook=change_the_object,
    )
    assert (result.outcome, result.reason) == ("refused", "VERSION_CONFLICT")
    assert world.tickets() == 0
    assert state_of(started) == ("human_required", "human_required", "VERSION_CONFLICT")
    evidence = Escalation.objects.get(pk=str(result.escalation_id)).evidence
    assert evidence["when"] == "between the checks and the call"
    assert {f["field"] for f in evidence["conflicting_fields"]} == {"email"}
    assert evidence["responsible_owner"] == "worker-1"
    assert "plan" in evidence


# --- 4. Permission revoked or credential expired after the task was queued -----------


def test_4_a_revoked_grant_stops_queued_work(world: World):
    started = world.start_task()
    portal_services.agent_grant_revoke(
        agent=world.agent, action="create_ticket", target="ticket-desk"
    )
    refused(world.execute(started), "PERMISSION_REVOKED")
    assert world.tickets() == 0


def test_4_an_expired_credential_is_caught_at_the_call(world: World):
    started = world.start_task()

    def pass_the_credential_ttl(point: str) -> None:
        if point == "before_call":  # the one SQL clock moves past the 60 s TTL
            with connection.cursor() as cursor:
                cursor.execute("SELECT portal_set_clock_offset('61 s')")

    try:
        result = gateway.operation_execute(
            tenant=world.tenant,
            operation_id=started["operation"]["id"],
            lease_token=started["token"],
            fields=field_gateway_values(world),
            actor=Actor.of_agent(world.agent),
            _test_hook=pass_the_credential_ttl,
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT portal_reset_clock_offset()")
    assert (result.outcome, result.reason) == ("refused", "CREDENTIAL_EXPIRED")
    assert world.tickets() == 0


def test_4_a_target_outside_the_contract_is_forbidden(world: World):
    started = world.start_task()
    Operation.objects.filter(pk=started["operation"]["id"])  # sanity: it exists
    services.object_version_record(
        tenant=world.tenant, object_type="customer_issue", object_id="1042", version="7"
    )
    spec = {
        **world.contract.spec,
        "policy": {**world.contract.spec["policy"], "write_targets": ["crm"]},
    }
    services.contract_retire(tenant=world.tenant, key="customer-issue", version=1)
    services.contract_create(
        tenant=world.tenant, key="customer-issue", spec=spec, publish=True
    )
    other = world.start_task(2001)  # pins v2, which may only write to "crm"
    refused(world.execute(other), "TARGET_FORBIDDEN")
    assert world.tickets() == 0


# --- 5. Remote succeeded, local process crashed before saving the receipt ------------


def test_5_a_crash_after_the_remote_acted_is_recovered_from_the_receipt(world: World):
    started = world.start_task()
    database = connection.settings_dict
    env = dict(
        os.environ,
        DATABASE_URL=(
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}"
            f"/{database['NAME']}"
        ),
    )
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.gateway_child",
            "--tenant",
            str(world.tenant.pk),
            "--operation",
            started["operation"]["id"],
            "--lease-token",
            str(started["token"]),
            "--agent",
            str(world.agent.pk),
            "--fields",
            json.dumps(world.fields()),
            "--crash-at",
            "after_call",
        ],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -9, child.stderr.decode()[-2000:]  # killed for real
    assert world.tickets() == 1  # the remote did it
    assert state_of(started)[1] == "executing"  # we never recorded it
    # A restarted worker rebuilds from the database once the call's deadline passed.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_operation SET next_check_at = app_now() - interval '1 s'"
        )
    assert check_receipts_job() == 1
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert operation.state == "verified"
    assert operation.provider_reference == world.desk.tickets()[0]["ticket_id"]
    assert operation.attempts == 1  # never a second call, never a new key
    assert world.tickets() == 1
    codes = list(
        Event.objects.filter(operation_id=operation.pk)
        .order_by("id")
        .values_list("code", flat=True)
    )
    recovery = [
        c
        for c in codes
        if c
        in (
            "operation.unknown",
            "receipt.queried",
            "operation.verified",
            "connector.called",
        )
    ]
    # One call before the crash, none after: recovery only looked the receipt up.
    assert recovery == ["operation.unknown", "receipt.queried", "operation.verified"]


@pytest.mark.parametrize("fault", ["execute_then_drop", "after_5xx", "slow"])
def test_5_an_answer_lost_in_transit_is_settled_by_lookup(world: World, fault):
    started = world.start_task()
    world.desk.set_fault(fault, delay_s=3.0)  # slow: longer than the 2 s read timeout
    body = world.execute(started).json()
    assert body["outcome"] == "verified", body
    assert world.tickets() == 1


def test_5_throttled_calls_retry_later_with_the_same_key(world: World):
    started = world.start_task()
    world.desk.set_fault("rate_limited", retry_after_s=1)
    assert world.execute(started).json()["outcome"] == "unknown"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    check_receipts_job()  # lookup: none -> bounded retry with the same key
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert (operation.state, operation.attempts) == ("verified", 2)
    assert world.tickets(key="ticket-for-issue-1042") == world.tickets() == 1


# --- 6. Duplicate and out-of-order events with the same action identity --------------


def test_6_concurrent_executions_of_one_operation_make_one_ticket(world: World):
    started = world.start_task()
    barrier = threading.Barrier(4, timeout=10)

    def execute() -> int:
        barrier.wait()
        return world.execute(started).status_code

    statuses = run_in_threads(*[execute] * 4)
    assert all(status == 200 for status in statuses), statuses
    assert world.tickets() == 1
    assert state_of(started)[1] == "verified"


def test_6_a_duplicate_reservation_is_the_same_operation(world: World):
    started = world.start_task()
    again = world.http.post(  # a retried agent step reserves the same identity again
        f"/api/v1/tasks/{started['task']['id']}/operations",
        json={
            "idempotency_key": "ticket-for-issue-1042",
            "action": "create_ticket",
            "target": "ticket-desk",
            "input": {
                "customer": "ana",
                "summary": "Refund for issue 1042",
                "queue": "billing",
            },
        },
        headers={"Lease-Token": str(started["token"])},
    )
    assert again.status_code == 200
    assert again.json()["id"] == started["operation"]["id"]
    world.execute(started)
    world.execute(started)
    assert world.tickets() == 1


def test_6_several_receipts_for_one_key_are_a_conflict(world: World):
    """The remote answers with one ticket but made two: the receipt check sees both."""
    started = world.start_task()
    world.desk.set_fault("duplicate")
    body = world.execute(started).json()
    assert (body["outcome"], body["reason_code"]) == ("conflict", "MULTIPLE_RECEIPTS")
    assert world.tickets() == 2  # the desk's own count shows the duplicate
    task = Task.objects.get(pk=started["task"]["id"])
    assert (task.state, task.reason_code) == ("human_required", "MULTIPLE_RECEIPTS")
    assert len(Escalation.objects.get(task=task).evidence["receipts"]) == 2


def test_6_several_receipts_found_in_recovery_are_a_conflict(world: World):
    """Recovery finds two receipts for the key: stop, conflict, keep the evidence."""
    started = world.start_task()
    # Another delivery of the same action identity reached the desk twice over.
    body = request_body(
        {
            "queue": "billing",
            "summary": "stray",
            "object": {"type": "customer_issue", "id": "1042"},
        }
    )
    token = credential_mint(
        claims={
            "aud": "ticket-desk",
            "iat": int(time.time()),
            "exp": int(time.time()) + 60,
            "jti": "x",
            "tenant": str(world.tenant.pk),
            "use": "execute",
            "action": "create_ticket",
            "idempotency_key": "ticket-for-issue-1042",
            "object_type": "customer_issue",
            "object_id": "1042",
            "fields": [],
            "body_sha256": body_digest(body),
        },
        connector=world.connector,
    )
    world.desk.set_fault("duplicate")
    stray = httpx.post(
        f"{world.desk.url}/tickets",
        content=body,
        headers={
            "Authorization": f"Bearer {token}",
            "Idempotency-Key": "ticket-for-issue-1042",
            "Content-Type": "application/json",
        },
    )
    assert stray.status_code == 201
    world.desk.set_fault("error_5xx")  # our own call: an unclear answer
    world.desk.set_fault("lookup_5xx")  # and the first look cannot tell
    assert world.execute(started).json()["outcome"] == "unknown"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    check_receipts_job()
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert (operation.state, operation.reason_code) == ("conflict", "MULTIPLE_RECEIPTS")
    assert state_of(started)[0] == "human_required"
    assert world.tickets() == 2  # and the gateway added none


def test_6_an_out_of_order_outcome_report_is_refused(world: World):
    started = world.start_task()
    world.execute(started)
    late = world.http.post(
        f"/api/v1/operations/{started['operation']['id']}/outcome",
        json={"outcome": "failed"},
        headers={"Lease-Token": str(started["token"])},
    )
    assert late.status_code == 409
    # On a target with a connector only the gateway records outcomes (issue 10 §2).
    assert late.json()["code"] == "GATEWAY_GOVERNED"
    assert state_of(started)[1] == "verified"


def test_6_the_same_key_with_another_input_is_refused(world: World):
    started = world.start_task()
    response = world.http.post(
        f"/api/v1/tasks/{started['task']['id']}/operations",
        json={
            "idempotency_key": "ticket-for-issue-1042",
            "action": "create_ticket",
            "target": "ticket-desk",
            "input": {"queue": "sales", "summary": "x"},
        },
        headers={"Lease-Token": str(started["token"])},
    )
    assert response.json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert world.tickets() == 0


# --- 7. The database restarted; unfinished work rebuilt -------------------------------


# It restarts the PostgreSQL server every test runs on: in the serial phase, alone.
@pytest.mark.slow
def test_7_unfinished_operations_are_rebuilt_after_a_database_restart(world: World):
    from tests.support.chaos import restart_database

    started = world.start_task()
    world.desk.set_fault("execute_then_drop")
    world.desk.set_fault("lookup_5xx")
    assert world.execute(started).json()["outcome"] == "unknown"
    how = restart_database()
    connection.close()  # this process's old connection died with the server
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    assert check_receipts_job() == 1, how
    assert state_of(started)[1] == "verified"
    assert world.tickets() == 1


# --- 8. A person claimed the task; the old worker tries to continue ------------------


def test_8_a_claim_fences_out_the_old_worker(world: World):
    started = world.start_task()
    refused(world.execute(started, world.fields(email=None)), "FIELD_MISSING")
    person = User.objects.create_user("sam", password="pw-for-tests-only-1")
    portal_services.membership_grant(
        tenant=world.tenant, user=person, role=Role.SUPPORT
    )
    task = takeover.task_get_for_person(user=person, task_id=started["task"]["id"])
    claimed = takeover.task_human_claim(task=task, user=person)
    assert claimed.lease_token > started["token"]
    # The old worker writes with its old token: refused everywhere, nothing changes.
    old = {"Lease-Token": str(started["token"])}
    transition = world.http.post(
        f"/api/v1/tasks/{task.pk}/transitions",
        json={"to": "succeeded", "expected_state_version": claimed.state_version},
        headers=old,
    )
    assert transition.json()["code"] == "LEASE_EXPIRED"
    assert world.execute(started).json()["code"] == "LEASE_EXPIRED"
    assert world.tickets() == 0
    # Approving the same input again would repeat the refusal: not allowed.
    with pytest.raises(ApprovalRepeatsRefusal):
        takeover.task_human_resolve(
            task=task,
            user=person,
            resolution="approve",
            operation_id=started["operation"]["id"],
        )
    # The person hands it back for a fresh read: automation's next execute under
    # the same key passes every check with the values it reads then.
    takeover.task_human_resolve(
        task=task,
        user=person,
        resolution="hand_back",
        operation_id=started["operation"]["id"],
        note="read the e-mail again",
    )
    lease = world.http.post(
        f"/api/v1/tasks/{task.pk}/lease", json={"owner": "w2"}
    ).json()
    run = world.http.post(
        f"/api/v1/tasks/{task.pk}/transitions",
        json={"to": "running", "expected_state_version": lease["state_version"]},
        headers={"Lease-Token": str(lease["lease"]["token"])},
    ).json()
    retried = world.execute({**started, "token": run["lease"]["token"]})
    assert retried.json()["outcome"] == "verified", retried.text
    assert world.tickets() == 1
    actors = list(
        Event.objects.filter(task_id=task.pk)
        .order_by("id")
        .values_list("code", "actor_type")
    )
    assert ("task.human_claimed", "user") in actors
    assert ("task.resolved", "user") in actors


def test_8_only_one_of_two_people_wins_a_claim(world: World):
    started = world.start_task()
    refused(world.execute(started, world.fields(email=None)), "FIELD_MISSING")
    people = []
    for name in ("ana", "bo"):
        person = User.objects.create_user(name, password="pw-for-tests-only-1")
        portal_services.membership_grant(
            tenant=world.tenant, user=person, role=Role.SUPPORT
        )
        people.append(person)
    task = Task.objects.get(pk=started["task"]["id"])
    barrier = threading.Barrier(2, timeout=10)

    def claim(person):
        barrier.wait()
        return takeover.task_human_claim(task=task, user=person)

    outcomes = run_in_threads(*[lambda p=p: claim(p) for p in people])
    assert sum(isinstance(o, Task) for o in outcomes) == 1, outcomes
    assert sum(isinstance(o, AlreadyClaimed) for o in outcomes) == 1


def test_a_connector_without_lookup_needs_a_one_time_approval(world: World):
    world.connector.supports_lookup = False
    world.connector.save()
    started = world.start_task()
    refused(world.execute(started), "APPROVAL_REQUIRED")
    assert world.tickets() == 0
    person = User.objects.create_user("ana", password="pw-for-tests-only-1")
    portal_services.membership_grant(tenant=world.tenant, user=person, role=Role.ADMIN)
    task = Task.objects.get(pk=started["task"]["id"])
    takeover.task_human_claim(task=task, user=person)
    takeover.task_human_resolve(
        task=task,
        user=person,
        resolution="retry",
        operation_id=started["operation"]["id"],
    )
    lease = world.http.post(
        f"/api/v1/tasks/{task.pk}/lease", json={"owner": "w2"}
    ).json()
    run = world.http.post(
        f"/api/v1/tasks/{task.pk}/transitions",
        json={"to": "running", "expected_state_version": lease["state_version"]},
        headers={"Lease-Token": str(lease["lease"]["token"])},
    ).json()
    assert (
        world.execute({**started, "token": run["lease"]["token"]}).json()["outcome"]
        == "verified"
    )
    assert world.tickets() == 1
    # The approval was used once: a later need for approval is refused again.
    assert not task.operations.get().approvals.filter(used_at__isnull=True).exists()
    assert (
        Operation.objects.get(pk=started["operation"]["id"]).state
        == OperationState.VERIFIED
    )
    assert Task.objects.get(pk=task.pk).state == TaskState.RUNNING


def test_a_result_that_stays_unknowable_goes_to_a_person(world: World):
    """Every lookup fails: after the lookup budget, RESULT_UNKNOWN and a person."""
    started = world.start_task()
    world.desk.set_fault("error_5xx")
    world.desk.set_fault("lookup_5xx", times=0)  # until cleared
    assert world.execute(started).json()["outcome"] == "unknown"
    for _ in range(settings.PORTAL_RECOVERY_MAX_LOOKUPS):
        with connection.cursor() as cursor:
            cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
        check_receipts_job()
    assert state_of(started) == ("human_required", "human_required", "RESULT_UNKNOWN")
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert operation.lookups == settings.PORTAL_RECOVERY_MAX_LOOKUPS
    assert operation.attempts == 1  # it never called again while it could not tell
    assert world.tickets() == 0
