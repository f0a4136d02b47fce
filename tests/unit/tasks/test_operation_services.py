"""Operation reservation and outcomes: idempotency keys, input hashes, the lease fence."""

from __future__ import annotations

import pytest
from django.db import connection

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.exceptions import (
    IdempotencyKeyReused,
    IllegalTransition,
    LeaseExpired,
    ValidationFailed,
)
from tasks import services
from tasks.exceptions import (
    ActionNotGranted,
    InputNotCanonicalisable,
    OperationNotFound,
    TaskNotFound,
)
from tasks.hashing import input_hash
from tasks.models import Operation, OperationState, TaskState

pytestmark = pytest.mark.django_db


@pytest.fixture
def task(make_task):
    return make_task(state=TaskState.RUNNING, leased=True)


def reserve(task, actor, key="ticket-42", payload=None, token=None):
    return services.operation_reserve(
        tenant=task.tenant,
        task_id=task.pk,
        lease_token=task.lease_token if token is None else token,
        idempotency_key=key,
        action="create_ticket",
        target="desk",
        input={"queue": "billing", "summary": "refund"} if payload is None else payload,
        actor=actor,
    )


def test_a_new_key_reserves_one_operation_with_the_jcs_hash(task, actor):
    reservation = reserve(task, actor)
    operation = reservation.operation
    assert reservation.created and operation.state == OperationState.RESERVED
    assert operation.input_hash == input_hash({"summary": "refund", "queue": "billing"})
    event = Event.objects.get(operation_id=operation.pk)
    assert event.code == EventCode.OPERATION_RESERVED
    assert event.payload["input_hash"] == operation.input_hash


def test_the_same_key_and_input_returns_the_stored_operation(task, actor):
    first = reserve(task, actor).operation
    # Same JSON value, other key order and number spelling: the same canonical hash.
    again = reserve(task, actor, payload={"summary": "refund", "queue": "billing"})
    assert not again.created and again.operation.pk == first.pk
    assert Operation.objects.count() == 1
    assert Event.objects.filter(code=EventCode.OPERATION_RESERVED).count() == 1


def test_the_same_key_with_another_input_is_refused_and_changes_nothing(task, actor):
    first = reserve(task, actor).operation
    with pytest.raises(IdempotencyKeyReused) as caught:
        reserve(task, actor, payload={"queue": "sales"})
    assert caught.value.code == ReasonCode.IDEMPOTENCY_KEY_REUSED
    assert caught.value.status == 422
    assert list(Operation.objects.values_list("pk", "input_hash")) == [
        (first.pk, first.input_hash)
    ]


def test_a_replay_after_the_lease_is_lost_still_returns_the_stored_operation(
    task, actor
):
    first = reserve(task, actor).operation
    assert reserve(task, actor, token=task.lease_token + 5).operation.pk == first.pk


def test_a_new_reservation_needs_the_live_lease(task, actor):
    with pytest.raises(LeaseExpired):
        reserve(task, actor, key="new", token=task.lease_token + 1)
    assert not Operation.objects.exists()


def test_reserving_on_another_tenants_task_is_not_found(task, other_tenant, make_agent):
    outsider = Actor.of_agent(make_agent(tenant=other_tenant))
    with pytest.raises(TaskNotFound):
        services.operation_reserve(
            tenant=other_tenant,
            task_id=task.pk,
            lease_token=task.lease_token,
            idempotency_key="k",
            action="a",
            target="t",
            input={},
            actor=outsider,
        )


def test_an_agent_without_a_grant_cannot_reserve(task, make_agent):
    """Checked before anything else, so it reveals nothing about the task."""
    ungranted = Actor.of_agent(make_agent(tenant=task.tenant, grants=()))
    with pytest.raises(ActionNotGranted):
        services.operation_reserve(
            tenant=task.tenant,
            task_id=task.pk,
            lease_token=task.lease_token,
            idempotency_key="k",
            action="create_ticket",
            target="desk",
            input={},
            actor=ungranted,
        )
    assert not Operation.objects.exists()


def test_a_target_specific_grant_allows_only_that_target(task, make_agent):
    agent = make_agent(tenant=task.tenant, grants=())
    portal_services.agent_grant(agent=agent, action="create_ticket", target="desk")
    kwargs = {
        "tenant": task.tenant,
        "task_id": task.pk,
        "lease_token": task.lease_token,
        "action": "create_ticket",
        "input": {},
        "actor": Actor.of_agent(agent),
    }
    assert services.operation_reserve(
        idempotency_key="k1", target="desk", **kwargs
    ).created
    with pytest.raises(ActionNotGranted):
        services.operation_reserve(idempotency_key="k2", target="crm", **kwargs)


@pytest.mark.parametrize("payload", [{"n": float("nan")}, {"n": 2**60}, {1: "x"}])
def test_inputs_without_a_canonical_form_are_refused(task, actor, payload):
    with pytest.raises(InputNotCanonicalisable):
        reserve(task, actor, payload=payload)


def test_execution_then_verified_outcome(task, actor):
    operation = reserve(task, actor).operation
    executing = services.operation_begin_execution(
        tenant=task.tenant,
        operation_id=operation.pk,
        lease_token=task.lease_token,
        actor=actor,
    )
    assert (executing.state, executing.attempts) == ("executing", 1)
    verified = services.operation_record_outcome(
        tenant=task.tenant,
        operation_id=operation.pk,
        lease_token=task.lease_token,
        outcome="verified",
        provider_reference="TCK-1",
        result={"ticket": "TCK-1", "token": "s3cret"},
        actor=actor,
    )
    assert verified.provider_reference == "TCK-1"
    assert verified.result == {"ticket": "TCK-1", "token": "[REDACTED]"}


def test_an_unknown_outcome_records_result_unknown_and_can_be_retried(task, actor):
    operation = reserve(task, actor).operation
    kwargs = {
        "tenant": task.tenant,
        "operation_id": operation.pk,
        "lease_token": task.lease_token,
        "actor": actor,
    }
    services.operation_begin_execution(**kwargs)
    unknown = services.operation_record_outcome(outcome="unknown", **kwargs)
    assert unknown.reason_code == ReasonCode.RESULT_UNKNOWN
    retried = services.operation_begin_execution(**kwargs)
    assert (retried.state, retried.attempts, retried.idempotency_key) == (
        "executing",
        2,
        operation.idempotency_key,
    )


def test_verified_needs_a_receipt_id(task, actor):
    operation = reserve(task, actor).operation
    with pytest.raises(ValidationFailed):
        services.operation_record_outcome(
            tenant=task.tenant,
            operation_id=operation.pk,
            lease_token=task.lease_token,
            outcome="verified",
            actor=actor,
        )


def test_an_operation_never_started_cannot_have_an_unknown_result(task, actor):
    """Nothing was called, so nothing can be in doubt (reserved -> failed is fine)."""
    operation = reserve(task, actor).operation
    with pytest.raises(IllegalTransition):
        services.operation_record_outcome(
            tenant=task.tenant,
            operation_id=operation.pk,
            lease_token=task.lease_token,
            outcome="unknown",
            actor=actor,
        )
    failed = services.operation_record_outcome(
        tenant=task.tenant,
        operation_id=operation.pk,
        lease_token=task.lease_token,
        outcome="failed",
        actor=actor,
    )
    assert (failed.state, failed.attempts) == ("failed", 0)


def test_an_outcome_under_a_stale_token_is_refused(task, actor):
    operation = reserve(task, actor).operation
    services.operation_begin_execution(
        tenant=task.tenant,
        operation_id=operation.pk,
        lease_token=task.lease_token,
        actor=actor,
    )
    with connection.cursor() as cursor:  # someone else took the lease over
        cursor.execute(
            "UPDATE tasks_task SET lease_token = lease_token + 1 WHERE id = %s",
            [task.pk],
        )
    with pytest.raises(LeaseExpired):
        services.operation_record_outcome(
            tenant=task.tenant,
            operation_id=operation.pk,
            lease_token=task.lease_token,
            outcome="failed",
            actor=actor,
        )
    assert Operation.objects.get(pk=operation.pk).state == OperationState.EXECUTING


def test_another_tenants_operation_is_not_found(task, actor, other_tenant):
    operation = reserve(task, actor).operation
    with pytest.raises(OperationNotFound):
        services.operation_begin_execution(
            tenant=other_tenant,
            operation_id=operation.pk,
            lease_token=task.lease_token,
            actor=actor,
        )
