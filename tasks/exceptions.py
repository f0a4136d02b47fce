"""Errors of the task, operation and contract domain."""

from __future__ import annotations

from portal import db as portal_db
from portal.codes import ReasonCode
from portal.exceptions import (
    IdempotencyKeyReused,
    IdempotentRequestInFlight,
    IllegalTransition,
    LeaseExpired,
    NotFound,
    PortalError,
    StaleState,
    ValidationFailed,
)


class TaskNotFound(NotFound):
    """No such task."""


class OperationNotFound(NotFound):
    """No such operation."""


class ObjectVersionNotFound(NotFound):
    """No version is recorded for this object."""


class ActionNotGranted(PortalError):
    """This agent holds no grant for that action on that target."""

    code = "ACTION_NOT_GRANTED"
    status = 403


class ContractNotFound(NotFound):
    """No such published contract version."""


class ContractRetired(PortalError):
    """The contract version is retired: no new work may start under it."""

    code = ReasonCode.CONTRACT_RETIRED
    status = 422


class ContractInvalid(ValidationFailed):
    """The contract spec is not valid."""

    code = "CONTRACT_INVALID"


class ContractImmutable(PortalError):
    """A published contract version cannot change; publish a new version instead."""

    code = "CONTRACT_IMMUTABLE"
    status = 409


class TaskIdReused(IdempotencyKeyReused):
    """This task id was already registered with different details; nothing changed."""


class LeaseHeld(PortalError):
    """Another owner holds an unexpired lease on this task."""

    code = "LEASE_HELD"
    status = 409
    retryable = True


class TaskNotLeasable(PortalError):
    """Only pending, running or waiting tasks can be leased."""

    code = "TASK_NOT_LEASABLE"
    status = 409


class GatewayGoverned(PortalError):
    """The gateway executes and records this target's operations; report nothing."""

    code = "GATEWAY_GOVERNED"
    status = 409


class GatewayRefused(PortalError):
    """The gateway refused the action; the task now waits for a person."""

    status = 422


# One problem class per reason, so the reason code is the problem's ``code``.
_REFUSALS: dict[str, type[GatewayRefused]] = {
    reason: type(
        f"Refused{reason.title().replace('_', '')}", (GatewayRefused,), {"code": reason}
    )
    for reason in ReasonCode.values
}


def gateway_refusal(reason: str) -> type[GatewayRefused]:
    """The ``GatewayRefused`` subclass whose ``code`` is ``reason`` (a reason code)."""
    return _REFUSALS[reason]


portal_db.register_constraint_errors(
    {
        "tasks_task_transition_trg": IllegalTransition,
        "tasks_operation_transition_trg": IllegalTransition,
        "tasks_task_state_version_trg": StaleState,
        "tasks_operation_state_version_trg": StaleState,
        "tasks_task_lease_token_trg": LeaseExpired,
        "tasks_contract_immutable_trg": ContractImmutable,
        "tasks_task_contract_same_tenant_fk": ContractNotFound,
        "tasks_operation_task_same_tenant_fk": TaskNotFound,
        "tasks_credential_operation_same_tenant_fk": OperationNotFound,
        "tasks_task_client_task_id_uniq": TaskIdReused,
        "tasks_operation_idempotency_key_uniq": IdempotencyKeyReused,
    }
)


class ConnectorKeyUnsealable(PortalError):
    """The connector's private key cannot be unsealed with this PORTAL_REDACTION_SECRET.

    If you're hitting this, the server secret the sealed connector keys were made
    under (``PORTAL_REDACTION_SECRET``, the key-encryption key, docs/redaction.md)
    is not the one configured now, or the sealed key was changed or copied from
    another row. Nothing was sent to the remote system. Configure the secret the
    keys were sealed under, or give the connector a new key (its public half must
    then be registered with the remote system). Operations in doubt are handed to
    a person after the recovery budget (docs/gateway.md, "Recovery protocol").
    """

    code = "CONNECTOR_KEY_UNSEALABLE"
    status = 503


class SealedValuesUnsealable(PortalError):
    """The operation's sealed values do not open with this PORTAL_REDACTION_SECRET.

    If you're hitting this, the server secret the operation's real values were
    sealed under (``PORTAL_REDACTION_SECRET``, docs/redaction.md) is not the one
    configured now, or the sealed column was changed or copied from another row.
    Nothing was sent to the remote system.
    """

    code = "SEALED_VALUES_UNSEALABLE"
    status = 503


class ApprovalNotAllowed(PortalError):
    """This person may not decide this approval, or it is decided already."""

    code = "APPROVAL_NOT_ALLOWED"
    status = 409


class ApprovalExpired(PortalError):
    """The approval's validity window has passed; it is recorded as expired."""

    code = "APPROVAL_EXPIRED"
    status = 409


class ApprovalNotFound(NotFound):
    """No such approval in your tenants."""


class ContractRequired(ValidationFailed):
    """The task pins no contract, so the gateway has nothing to check its fields by."""

    code = "CONTRACT_REQUIRED"
    status = 422


class InputNotCanonicalisable(ValidationFailed):
    """The input cannot be written as canonical JSON (RFC 8785)."""


class InvalidCursor(NotFound):
    """That page link is not valid; start again from the first page.

    A 404, like an agent list's unknown ``cursor``: no schema can tell a cursor
    this portal wrote from any other string, so it is "no such page", not bad input.
    """


class OutboundRefused(PortalError):
    """The outbound URL policy forbids calling that address; nothing was sent."""

    code = ReasonCode.TARGET_FORBIDDEN
    status = 422


class AlreadyClaimed(PortalError):
    """Someone else claimed this task first."""

    code = "ALREADY_CLAIMED"
    status = 409


class NotYourClaim(PortalError):
    """Only the person who claimed the task can release or resolve it."""

    code = "NOT_YOUR_CLAIM"
    status = 409


class ApprovalRepeatsRefusal(ApprovalNotAllowed):
    """Approving the same input again would repeat what was refused.

    Edit the field values (with their source and read time) or hand the task back
    for a fresh read instead.
    """


class ActionInFlight(IdempotentRequestInFlight):
    """Another call with this action key is under way; repeat the same call later."""
