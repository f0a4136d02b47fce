"""An operation's real values: sealed while a call may follow, gone once settled."""

from __future__ import annotations

import pytest
from django.db import transaction

from audit.models import Event, EventCode
from portal.actors import Actor
from tasks import services
from tasks.exceptions import SealedValuesUnsealable
from tasks.models import Operation, OperationState, TaskState
from tasks.sealed import operation_values, seal, unseal

from .conftest import execute, refused_by

pytestmark = pytest.mark.django_db

SETTLED = [OperationState.VERIFIED, OperationState.FAILED, OperationState.CONFLICT]
OPEN = [s for s in OperationState.values if s not in SETTLED]


@pytest.mark.parametrize("state", SETTLED)
def test_the_database_refuses_a_settled_operation_that_keeps_sealed_values(
    make_operation, state
):
    operation = make_operation(state=state)
    with refused_by("tasks_operation_sealed_open_only_check"):
        execute(
            "UPDATE tasks_operation SET sealed = 'v1:x' WHERE id = %s", [operation.pk]
        )


@pytest.mark.parametrize("state", OPEN)
def test_an_open_operation_may_hold_sealed_values(make_operation, state):
    operation = make_operation(state=state)
    assert (
        execute(
            "UPDATE tasks_operation SET sealed = 'v1:x' WHERE id = %s", [operation.pk]
        )
        == 1
    )


def test_a_sealed_value_opens_only_for_its_own_tenant_and_operation(
    make_operation, other_tenant
):
    operation = make_operation()
    sealed = seal(
        tenant_id=operation.tenant_id, operation_id=operation.pk, values={"a": 1}
    )
    assert unseal(
        tenant_id=operation.tenant_id, operation_id=operation.pk, sealed=sealed
    ) == {"a": 1}
    other = make_operation()
    with pytest.raises(SealedValuesUnsealable):
        unseal(tenant_id=operation.tenant_id, operation_id=other.pk, sealed=sealed)
    with pytest.raises(SealedValuesUnsealable):
        unseal(tenant_id=other_tenant.pk, operation_id=operation.pk, sealed=sealed)


def test_reserve_stores_the_input_redacted_and_seals_it_until_settled(make_task):
    # given a running task and an input with an e-mail address and a token
    task = make_task(state=TaskState.RUNNING, leased=True)
    real = {"queue": "billing", "summary": "mail ana@example.com, ghp_" + "a1B2" * 9}
    actor = Actor.system("test")
    reservation = services.operation_reserve(
        tenant=task.tenant,
        task_id=task.pk,
        lease_token=task.lease_token,
        idempotency_key="sealed-1",
        action="a",
        target="somewhere",
        input=real,
        actor=actor,
    )
    stored = Operation.objects.get(pk=reservation.operation.pk)
    # then the column holds no value, the sealed copy is the real input
    assert "ana@example.com" not in str(stored.input) and "ghp_" not in str(
        stored.input
    )
    assert "ana@example.com" not in stored.sealed
    assert operation_values(stored) == (real, None)
    assert stored.input_hash == reservation.operation.input_hash
    # when it is settled, the sealed copy is gone in the same statement
    with transaction.atomic():
        for to in (OperationState.EXECUTING, OperationState.FAILED):
            services.operation_move(
                tenant=task.tenant,
                operation_id=stored.pk,
                to=to,
                actor=actor,
                lease_token=task.lease_token,
            )
    settled = Operation.objects.get(pk=stored.pk)
    assert settled.state == OperationState.FAILED and settled.sealed is None
    assert (
        Event.objects.filter(
            operation_id=stored.pk, code=EventCode.OPERATION_FAILED
        ).count()
        == 1
    )
