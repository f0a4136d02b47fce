"""What an execution comes to: the result types, and the record of a call's answer.

``record_call`` writes what the remote system said, in its own transaction, and
decides the operation's state from it: a success stands only with a lone matching
receipt; a rejection fails; anything else is in doubt and goes to recovery.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any, Final, Literal

from django.conf import settings
from django.db import connection, transaction

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.models import Tenant
from portal.tracing import Trace

from .. import escalation, services
from ..connectors import CallResult, LookupResult
from ..models import Connector, Operation, OperationState, Task
from .common import lock, plan

Outcome = Literal["verified", "failed", "unknown", "conflict", "refused", "queued"]


@dataclass(frozen=True, kw_only=True)
class GatewayResult:
    """What became of an execution request."""

    outcome: Outcome
    operation: Operation
    reason: str | None = None
    escalation_id: uuid.UUID | None = None


@dataclass(frozen=True, kw_only=True)
class Authorized:
    """Every check passed: what the call needs (its credentials and body).

    ``token`` is good for one ``execute`` request carrying exactly ``body``;
    ``lookup_token`` (when the connector looks receipts up) for one confirming
    lookup by the operation's key.
    """

    operation: Operation
    connector: Connector
    credential_id: uuid.UUID
    token: str
    body: bytes
    lookup_credential_id: uuid.UUID | None = None
    lookup_token: str | None = None
    # What the executing event records of each credential (``call.credential_facts``).
    credentials: tuple[dict[str, Any], ...] = ()
    # The pinned contract's ``receipt.required``, read with it by the caller
    # (published versions never change, so it holds until the call is recorded).
    receipt_required: bool = True

    @property
    def credential_ids(self) -> list[uuid.UUID]:
        """Every credential issued for this call: all are spent once it is made."""
        ids = [self.credential_id]
        if self.lookup_credential_id is not None:
            ids.append(self.lookup_credential_id)
        return ids


@dataclass(frozen=True, kw_only=True)
class Refused:
    """A check refused and the task went to a person; ``result`` says so."""

    result: GatewayResult


_OUTCOMES: Final[dict[str, Outcome]] = {
    OperationState.VERIFIED: "verified",
    OperationState.FAILED: "failed",
    OperationState.CONFLICT: "conflict",
    OperationState.HUMAN_REQUIRED: "refused",
}


def outcome_of(operation: Operation) -> Outcome:
    """The outcome an operation's state stands for (anything open is ``unknown``)."""
    return _OUTCOMES.get(operation.state, "unknown")


def standing(operation: Operation) -> GatewayResult:
    """Where an operation stands, with its reason: the answer to a repeated request."""
    return GatewayResult(
        outcome=outcome_of(operation),
        operation=operation,
        reason=operation.reason_code,
    )


def credential_expired(*, tenant: Tenant, credential_id: uuid.UUID) -> bool:
    """Whether the credential's expiry has passed on the database clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT expires_at <= app_now() FROM tasks_credential "
            "WHERE tenant_id = %s AND id = %s",
            [tenant.pk, credential_id],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def credentials_spend(
    *, tenant: Tenant, credential_ids: list[uuid.UUID]
) -> list[uuid.UUID]:
    """Revoke used credentials in the caller's transaction; returns those revoked now.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    if not credential_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_credential SET revoked_at = app_now() "
            "WHERE tenant_id = %s AND id = ANY(%s) AND revoked_at IS NULL "
            "RETURNING id",
            [tenant.pk, list(credential_ids)],
        )
        return sorted(row[0] for row in cursor.fetchall())


@transaction.atomic(durable=True)
def record_call(
    *,
    tenant: Tenant,
    operation: Operation,
    result: CallResult,
    confirmation: LookupResult | None,
    actor: Actor,
    trace: Trace,
    credential_id: uuid.UUID | None = None,
    spent: list[uuid.UUID] | None = None,
) -> Operation:
    """Write what the call did, in a new transaction; one event for the call itself.

    The call's credentials (``spent``) are revoked in the same transaction: each was
    good for one request, and none is good for another.

    A success is ``verified`` only when its receipt stands alone: if the receipt
    lookup (``confirmation``) shows several receipts for the key, or none that match,
    the answer is not evidence and the operation goes to ``conflict`` or recovery.
    A 401 for a credential (``credential_id``) that has expired by now on the
    database clock is not a rejection of the request: it goes to ``unknown`` with
    ``CREDENTIAL_EXPIRED``, for a fresh credential under the same key.
    """
    lock(tenant=tenant, operation_id=operation.pk)
    revoked = credentials_spend(tenant=tenant, credential_ids=spent or [])
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.CONNECTOR_CALLED,
        actor=actor,
        task_id=operation.task_id,
        operation_id=operation.pk,
        trace=trace,
        data=payloads.ConnectorCalled(
            {
                "attempt": operation.attempts,
                **result.as_event_data(),
                "credentials_revoked": [str(pk) for pk in revoked],
            }
        ),
    )
    common: dict[str, Any] = {
        "tenant": tenant,
        "operation_id": operation.pk,
        "actor": actor,
        "trace": trace,
        "expected_version": operation.state_version,
    }
    if result.kind == "succeeded" and confirmation is not None:
        audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.RECEIPT_QUERIED,
            actor=actor,
            task_id=operation.task_id,
            operation_id=operation.pk,
            trace=trace,
            data=payloads.ReceiptQueried(
                {
                    "outcome": confirmation.kind,
                    "receipts": confirmation.references[:10],
                    "count": len(confirmation.references),
                    "purpose": "confirm",
                    "error": confirmation.error[:200],
                }
            ),
        )
        references = confirmation.references
        if confirmation.kind == "found" and (
            len(references) > 1 or references != [result.provider_reference]
        ):
            doubtful = services.operation_move(
                to=OperationState.UNKNOWN,
                reason=ReasonCode.MULTIPLE_RECEIPTS,
                data={"answered": result.provider_reference},
                **common,
            )
            conflicted = services.operation_move(
                tenant=tenant,
                operation_id=operation.pk,
                actor=actor,
                trace=trace,
                expected_version=doubtful.state_version,
                to=OperationState.CONFLICT,
                reason=ReasonCode.MULTIPLE_RECEIPTS,
            )
            task = Task.objects.select_for_update(of=("self",)).get(
                tenant=tenant, pk=operation.task_id
            )
            escalation.escalate(
                tenant=tenant,
                task=task,
                operation=conflicted,
                reason=ReasonCode.MULTIPLE_RECEIPTS,
                actor=actor,
                trace=trace,
                evidence={
                    "plan": plan(conflicted, task),
                    "answered": result.provider_reference,
                    "receipts": references,
                },
            )
            return conflicted
        if confirmation.kind == "none":
            # It says done, yet the system of record knows nothing: not evidence.
            return services.operation_move(
                to=OperationState.UNKNOWN,
                reason=ReasonCode.RESULT_UNKNOWN,
                check_in=dt.timedelta(0),
                data={"call": "unconfirmed"},
                **common,
            )
    if result.kind == "succeeded":
        return services.operation_move(
            to=OperationState.VERIFIED,
            provider_reference=result.provider_reference,
            # The provider's answer is kept as a keyed digest and its size (the
            # receipt id is the reference): never the body, which echoes the input.
            result={"status": result.status, "provider_response": result.body},
            data={
                "confirmed": confirmation is not None and confirmation.kind == "found"
            },
            **common,
        )
    if (
        result.kind == "rejected"
        and result.status == 401
        and credential_id is not None
        and credential_expired(tenant=tenant, credential_id=credential_id)
    ):
        # The remote refused the credential, not the request: nothing happened.
        # In doubt until a fresh credential runs it; if this process dies here,
        # recovery looks the receipt up and retries under the same key.
        return services.operation_move(
            to=OperationState.UNKNOWN,
            reason=ReasonCode.CREDENTIAL_EXPIRED,
            check_in=dt.timedelta(seconds=settings.PORTAL_EXECUTION_DEADLINE_S),
            data={"call": "credential_expired", "jti": str(credential_id)},
            **common,
        )
    if result.kind == "rejected":
        return services.operation_move(
            to=OperationState.FAILED,
            result={"status": result.status, "provider_response": result.body},
            **common,
        )
    # In doubt (or throttled): recovery looks the receipt up, same key, later.
    wait = dt.timedelta(seconds=result.retry_after_s or 0)
    return services.operation_move(
        to=OperationState.UNKNOWN,
        reason=ReasonCode.RESULT_UNKNOWN,
        check_in=wait,
        data={"call": result.kind},
        **common,
    )
