from __future__ import annotations

from audit.models import Event, Outbox
from tasks import services
from tasks.models import TaskState


def test_register_claim_transition_reserve_outcome(tenant, actor):
    """The happy path writes one event and one outbox row per state change."""
    registration = services.task_register(
        tenant=tenant,
        actor=actor,
        client_task_id="t-1",
        workflow_key="w",
        workflow_version="1",
        object_type="issue",
        object_id="42",
        object_version="7",
    )
    assert registration.created
    task = services.task_claim_next(tenant=tenant, owner="w1", actor=actor)
    assert task is not None and task.state == TaskState.RUNNING
    reservation = services.operation_reserve(
        tenant=tenant,
        task_id=task.pk,
        lease_token=task.lease_token,
        idempotency_key="k1",
        action="create_ticket",
        target="desk",
        input={"a": 1},
        actor=actor,
    )
    op = services.operation_begin_execution(
        tenant=tenant,
        operation_id=reservation.operation.pk,
        lease_token=task.lease_token,
        actor=actor,
    )
    op = services.operation_record_outcome(
        tenant=tenant,
        operation_id=op.pk,
        lease_token=task.lease_token,
        outcome="verified",
        provider_reference="r-1",
        actor=actor,
    )
    done = services.task_transition(
        tenant=tenant,
        task_id=task.pk,
        to=TaskState.SUCCEEDED,
        expected_version=task.state_version,
        lease_token=task.lease_token,
        actor=actor,
    )
    assert done.state == TaskState.SUCCEEDED and done.lease_owner is None
    codes = list(
        Event.objects.filter(tenant=tenant)
        .order_by("id")
        .values_list("code", flat=True)
    )
    assert codes == [
        "task.registered",
        "task.claimed",
        "operation.reserved",
        "operation.executing",
        "operation.verified",
        "task.transitioned",
    ]
    assert Outbox.objects.filter(tenant=tenant).count() == 6
