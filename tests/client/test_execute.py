"""``execute_operation`` and the gateway's typed refusals, against a live portal
seeded by ``seed_demo`` and a real ticket desk."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from portal.codes import ReasonCode
from portal_client import (
    ContractRetired,
    Execution,
    FieldRefused,
    FieldStale,
    FieldValue,
    GatewayContractRetired,
    GatewayRefused,
    PortalClient,
    PortalError,
    Task,
    VersionConflict,
)
from portal_client import errors as client_errors
from tasks import services as task_services
from tasks.models import Escalation
from tasks.models import Task as TaskRow
from ticketdesk.harness import TicketDesk

from .conftest import Demo


@pytest.fixture
def agent(portal_url: str, demo: Demo) -> Iterator[PortalClient]:
    with PortalClient(portal_url, demo.secret, backoff_s=0.05) as client:
        yield client


def fields(*, email_age: dt.timedelta = dt.timedelta(0)) -> list[FieldValue]:
    now = dt.datetime.now(dt.UTC)
    return [
        FieldValue(
            name="email",
            value="ana@example.com",
            source="crm",
            observed_at=now - email_age,
        ),
        FieldValue(name="plan", value="pro", source="billing", observed_at=now),
    ]


def started(agent: PortalClient, n: int) -> tuple[Task, str]:
    """A running task pinned to customer-issue v1, with one reserved operation."""
    agent.record_object_version("customer_issue", str(n), version="7")
    task, _ = agent.register_task(
        client_task_id=f"issue-{n}",
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id=str(n),
        object_version="7",
        contract_key="customer-issue",
    )
    leased = agent.acquire_lease(task.id, owner="worker-1", ttl_s=60)
    running = agent.transition(
        task.id,
        to="running",
        expected_state_version=leased.state_version,
        lease_token=leased.lease.token,
    )
    operation, _ = agent.reserve_operation(
        task.id,
        lease_token=running.lease.token,
        idempotency_key=f"ticket-for-issue-{n}",
        action="create_ticket",
        target="ticket-desk",
        input={"queue": "billing", "summary": f"issue {n}", "customer": "C-1"},
    )
    return running, operation.id


def test_execute_verifies_one_ticket_and_a_repeat_reports_without_calling_again(
    agent: PortalClient, desk: TicketDesk
) -> None:
    task, operation_id = started(agent, 1)

    execution = agent.execute_operation(
        operation_id, lease_token=task.lease.token, field_values=fields()
    )

    assert isinstance(execution, Execution)
    assert execution.outcome == "verified"
    assert execution.reason_code is None and execution.escalation_id is None
    [ticket] = desk.tickets()
    assert execution.operation.id == operation_id
    assert execution.operation.state == "verified"
    assert execution.operation.provider_reference == ticket["ticket_id"]
    assert execution.raw["outcome"] == "verified"

    # Plain mappings work too; the same operation again reports where it stands.
    again = agent.execute_operation(
        operation_id,
        lease_token=task.lease.token,
        field_values=[value.as_json() for value in fields()],
    )
    assert again.outcome == "verified"
    assert desk.effects()["tickets_created"] == 1


def test_a_stale_field_raises_field_stale_with_the_escalation(
    agent: PortalClient, desk: TicketDesk, demo: Demo
) -> None:
    task, operation_id = started(agent, 2)

    with pytest.raises(FieldStale) as refused:
        agent.execute_operation(
            operation_id,
            lease_token=task.lease.token,
            field_values=fields(email_age=dt.timedelta(minutes=10)),
        )

    error = refused.value
    assert isinstance(error, FieldRefused) and isinstance(error, GatewayRefused)
    assert (error.status, error.code, error.reason) == (
        422,
        "FIELD_STALE",
        "FIELD_STALE",
    )
    assert error.task_state == "human_required"
    assert error.operation_id == operation_id
    escalation = Escalation.objects.get(tenant=demo.tenant, task_id=task.id)
    assert error.escalation_id == str(escalation.pk)
    assert TaskRow.objects.get(pk=task.id).state == "human_required"
    assert desk.effects()["tickets_created"] == 0


def test_a_changed_object_raises_version_conflict(
    agent: PortalClient, desk: TicketDesk
) -> None:
    task, operation_id = started(agent, 3)
    agent.record_object_version("customer_issue", "3", version="8")

    with pytest.raises(VersionConflict) as refused:
        agent.execute_operation(
            operation_id, lease_token=task.lease.token, field_values=fields()
        )

    assert refused.value.reason == "VERSION_CONFLICT"
    assert refused.value.escalation_id is not None
    assert desk.effects()["tickets_created"] == 0


def test_contract_retired_is_a_refusal_at_execution_but_not_at_registration(
    agent: PortalClient, demo: Demo, desk: TicketDesk
) -> None:
    task, operation_id = started(agent, 4)
    task_services.contract_retire(tenant=demo.tenant, key="customer-issue", version=1)

    with pytest.raises(GatewayContractRetired) as refused:
        agent.execute_operation(
            operation_id, lease_token=task.lease.token, field_values=fields()
        )
    assert isinstance(refused.value, ContractRetired)  # one `except` catches both
    assert refused.value.task_state == "human_required"

    with pytest.raises(ContractRetired) as at_registration:
        agent.register_task(
            client_task_id="issue-5",
            workflow_key="customer-issue",
            workflow_version="1",
            object_type="customer_issue",
            object_id="5",
            object_version="7",
            contract_key="customer-issue",
            contract_version=1,
        )
    assert not isinstance(at_registration.value, GatewayRefused)
    assert desk.effects()["tickets_created"] == 0


# The portal's reason codes that are not gateway refusals: they answer 409 (or
# are refused before anything reaches the gateway).
NOT_REFUSALS = {"LEASE_EXPIRED", "IDEMPOTENCY_KEY_REUSED", "STALE_STATE"}
# The kill switch and the limits refuse the request itself (403, 429, 422 problem
# answers: docs/limits.md), before any gateway check; the client raises its
# problem errors for them, not a gateway refusal class.
NOT_REFUSALS |= {"AGENT_FROZEN", "TENANT_FROZEN", "RATE_LIMITED", "BUDGET_EXCEEDED"}


def test_every_gateway_reason_code_has_its_refusal_class() -> None:
    # The client's copy of the codes must follow the portal's list.
    assert set(client_errors.REFUSALS_BY_CODE) == set(ReasonCode.values) - NOT_REFUSALS
    for code, cls in client_errors.REFUSALS_BY_CODE.items():
        body: dict[str, Any] = {
            "code": code,
            "detail": "refused",
            "task_state": "human_required",
            "escalation_id": "e-1",
        }
        error = client_errors.error_from_problem(422, body)
        assert type(error) is cls
        assert (error.reason, error.escalation_id) == (code, "e-1")
        # The same code with another status is not a refusal.
        assert not isinstance(
            client_errors.error_from_problem(409, body), GatewayRefused
        )


def test_a_refusal_newer_than_the_client_is_still_a_gateway_refusal() -> None:
    error = client_errors.error_from_problem(
        422, {"code": "SOMETHING_NEW", "task_state": "human_required"}
    )
    assert type(error) is GatewayRefused
    assert error.escalation_id is None
    assert (
        type(client_errors.error_from_problem(422, {"code": "SOMETHING_NEW"}))
        is PortalError
    )


def test_field_values_need_an_aware_time() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        FieldValue(name="email", value="a", source="crm", observed_at=dt.datetime.now())  # noqa: DTZ005 (naive on purpose)
