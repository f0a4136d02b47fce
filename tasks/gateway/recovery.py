"""Recovery: settle an operation whose result is in doubt, by its key, never anew.

``operation_recover`` looks the receipt up by the operation's own idempotency key
and decides from what it finds: one receipt verifies, several are a conflict for a
person, none allows a bounded retry under the *same* key, and an answer that cannot
tell is looked at again later, then handed to a person. The settle job
(``tasks.jobs``) finds due operations with ``unscoped_operations_due``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any, Final

from django.conf import settings
from django.db import connection, transaction

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal import scope
from portal import selectors as portal_selectors
from portal.codes import ReasonCode
from portal.db import db_now
from portal.models import Tenant
from portal.tracing import NO_TRACE, Trace

from .. import escalation, services
from ..connectors import LookupResult, RemoteSystem, connector_for
from ..contracts import contract_receipt_required
from ..credentials import USE_LOOKUP
from ..exceptions import ConnectorKeyUnsealable
from ..models import (
    Connector,
    Contract,
    ContractStatus,
    Operation,
    OperationState,
    Task,
)
from ..sealed import unsealable_log
from . import revocation
from .call import authorize_call, call, credential_facts, issue_credential
from .common import SYSTEM, TestHook, lock, no_hook, plan
from .results import (
    Authorized,
    GatewayResult,
    credentials_spend,
    outcome_of,
    standing,
)

LOOKUP_CREDENTIAL_TTL_S: Final = 60


def backoff(attempt: int) -> dt.timedelta:
    base = settings.PORTAL_RECOVERY_BACKOFF_S
    return dt.timedelta(seconds=min(base * 2 ** max(attempt - 1, 0), 300))


@dataclass(frozen=True, kw_only=True)
class Lookup:
    """A claimed look: the lookup credential, or (``token`` None) why none could be
    minted (``refused``: nothing is sent, the look counts as "cannot tell")."""

    operation: Operation
    task: Task
    connector: Connector
    token: str | None
    credential_id: uuid.UUID | None
    refused: str = ""
    # What the look's receipt.queried event records of its credential.
    credential: dict[str, Any] | None = None


@transaction.atomic(durable=True)
def recovery_claim(
    *, tenant: Tenant, operation_id: uuid.UUID, trace: Trace
) -> Lookup | GatewayResult | None:
    """Claim an operation in doubt for one recovery look, or settle it without one."""
    locked = lock(tenant=tenant, operation_id=operation_id, skip_locked=True)
    if locked is None:
        return None  # another runner holds it, or it is gone
    task, operation = locked
    now = db_now()
    due = operation.next_check_at is None or operation.next_check_at <= now
    if operation.state == OperationState.EXECUTING and due:
        # The caller died mid-call (or never recorded): the answer is in doubt.
        operation = services.operation_move(
            tenant=tenant,
            operation_id=operation.pk,
            to=OperationState.UNKNOWN,
            expected_version=operation.state_version,
            actor=SYSTEM,
            trace=trace,
            reason=ReasonCode.RESULT_UNKNOWN,
            check_in=dt.timedelta(0),
            data={"cause": "execution deadline passed"},
        )
    elif operation.state != OperationState.UNKNOWN or not due:
        return standing(operation)
    connector = Connector.objects.filter(tenant=tenant, target=operation.target).first()
    if connector is None or not connector.supports_lookup:
        record = escalation.escalate(
            tenant=tenant,
            task=task,
            operation=operation,
            reason=ReasonCode.RESULT_UNKNOWN,
            actor=SYSTEM,
            trace=trace,
            evidence={
                "plan": plan(operation, task),
                "why": "the connector cannot look receipts up",
            },
        )
        operation.refresh_from_db()
        return GatewayResult(
            outcome="refused",
            operation=operation,
            reason=ReasonCode.RESULT_UNKNOWN,
            escalation_id=record.pk,
        )
    # Hold the claim while looking, so a second runner does not look too.
    Operation.objects.filter(tenant=tenant, pk=operation.pk).update(
        next_check_at=now + dt.timedelta(seconds=settings.PORTAL_EXECUTION_DEADLINE_S)
    )
    try:
        token, credential = issue_credential(
            tenant=tenant,
            task=task,
            operation=operation,
            connector=connector,
            ttl_s=LOOKUP_CREDENTIAL_TTL_S,
            field_names=[],
            action=operation.action,
            now=now,
            actor=SYSTEM,
            trace=trace,
            use=USE_LOOKUP,
        )
    except ConnectorKeyUnsealable as error:
        # Configuration, not the remote: said once per connector, and the look
        # counts as "cannot tell", so the budget hands it to a person.
        unsealable_log(error)
        return Lookup(
            operation=operation,
            task=task,
            connector=connector,
            token=None,
            credential_id=None,
            refused=f"{error.code}: {error.detail}",
        )
    return Lookup(
        operation=operation,
        task=task,
        connector=connector,
        token=token,
        credential_id=credential.pk,
        credential=credential_facts(
            credential, use=USE_LOOKUP, ttl_s=LOOKUP_CREDENTIAL_TTL_S
        ),
    )


def operation_recover(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    trace: Trace = NO_TRACE,
    _test_hook: TestHook = no_hook,
    remote: RemoteSystem | None = None,
) -> GatewayResult:
    """The recovery protocol for one operation whose result is in doubt.

    Looks the receipt up by the operation's key: exactly one → ``verified`` with its
    reference; several → ``conflict`` (``MULTIPLE_RECEIPTS``) and a person; none (so
    definitely not executed) → a bounded retry with the *same* key while the pinned
    contract and the agent's grant still allow it; cannot tell → look again later,
    and after the lookup budget a person (``RESULT_UNKNOWN``). Rebuilds everything
    from the database; safe on many runners at once.
    """
    portal_db.forbid_transaction("recovery queries the remote system")
    claim = recovery_claim(tenant=tenant, operation_id=operation_id, trace=trace)
    if claim is None:
        operation = Operation.objects.get(tenant=tenant, pk=operation_id)
        return GatewayResult(outcome=outcome_of(operation), operation=operation)
    if isinstance(claim, GatewayResult):
        return claim
    remote = remote or connector_for(claim.connector)
    if claim.token is None:  # no credential: nothing is sent
        lookup = LookupResult(kind="unknown", error=claim.refused)
    else:
        lookup = remote.lookup(
            idempotency_key=claim.operation.idempotency_key, credential=claim.token
        )
    _test_hook("after_lookup")
    decision = recovery_decide(tenant=tenant, claim=claim, lookup=lookup, trace=trace)
    if lookup.status != 200 and claim.credential_id is not None:
        # The lookup may not have reached the target's replay cache.
        revocation.credentials_notify(
            tenant=tenant,
            connector=claim.connector,
            credential_ids=[claim.credential_id],
            remote=remote,
        )
    if not isinstance(decision, Authorized):
        return decision
    operation = call(
        tenant=tenant,
        authorized=decision,
        operation=decision.operation,
        actor=SYSTEM,
        trace=trace,
        hook=_test_hook,
        remote=remote,
    )
    return standing(operation)


@transaction.atomic(durable=True)
def recovery_decide(
    *, tenant: Tenant, claim: Lookup, lookup: LookupResult, trace: Trace
) -> GatewayResult | Authorized:
    locked = lock(tenant=tenant, operation_id=claim.operation.pk)
    assert locked is not None  # operations are never deleted while in doubt
    task, operation = locked
    # The lookup's credential is spent, whatever became of the operation meanwhile.
    if claim.credential_id is not None:
        credentials_spend(tenant=tenant, credential_ids=[claim.credential_id])
    if operation.state_version != claim.operation.state_version:
        return GatewayResult(outcome=outcome_of(operation), operation=operation)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.RECEIPT_QUERIED,
        actor=SYSTEM,
        task_id=task.pk,
        operation_id=operation.pk,
        trace=trace,
        data=payloads.ReceiptQueried(
            {
                "outcome": lookup.kind,
                "receipts": lookup.references[:10],
                "count": len(lookup.references),
                "status": lookup.status,
                "error": lookup.error[:200],
                "lookup": operation.lookups + 1,
                "issued": [claim.credential] if claim.credential else [],
            }
        ),
    )
    common: dict[str, Any] = {
        "tenant": tenant,
        "operation_id": operation.pk,
        "actor": SYSTEM,
        "trace": trace,
        "expected_version": operation.state_version,
        "lookup": True,
    }

    def to_person(reason: ReasonCode, **evidence: Any) -> GatewayResult:
        record = escalation.escalate(
            tenant=tenant,
            task=task,
            operation=operation,
            reason=reason,
            evidence={"plan": plan(operation, task), **evidence},
            actor=SYSTEM,
            trace=trace,
        )
        operation.refresh_from_db()
        return GatewayResult(
            outcome="refused",
            operation=operation,
            reason=reason,
            escalation_id=record.pk,
        )

    if lookup.kind == "found" and len(lookup.references) == 1:
        moved = services.operation_move(
            to=OperationState.VERIFIED,
            provider_reference=lookup.references[0],
            **common,
        )
        return GatewayResult(outcome="verified", operation=moved)
    if lookup.kind == "found":
        moved = services.operation_move(
            to=OperationState.CONFLICT,
            reason=ReasonCode.MULTIPLE_RECEIPTS,
            **common,
        )
        record = escalation.escalate(
            tenant=tenant,
            task=task,
            operation=moved,
            reason=ReasonCode.MULTIPLE_RECEIPTS,
            actor=SYSTEM,
            trace=trace,
            evidence={"plan": plan(moved, task), "receipts": lookup.references},
        )
        return GatewayResult(
            outcome="conflict",
            operation=moved,
            reason=ReasonCode.MULTIPLE_RECEIPTS,
            escalation_id=record.pk,
        )
    if lookup.kind == "unknown":
        if operation.lookups + 1 >= settings.PORTAL_RECOVERY_MAX_LOOKUPS:
            Operation.objects.filter(tenant=tenant, pk=operation.pk).update(
                lookups=operation.lookups + 1
            )
            operation.refresh_from_db()
            return to_person(
                ReasonCode.RESULT_UNKNOWN,
                lookup_error=lookup.error,
                lookups=operation.lookups,
            )
        Operation.objects.filter(tenant=tenant, pk=operation.pk).update(
            lookups=operation.lookups + 1,
            next_check_at=db_now() + backoff(operation.lookups + 1),
        )
        operation.refresh_from_db()
        return GatewayResult(
            outcome="unknown", operation=operation, reason=ReasonCode.RESULT_UNKNOWN
        )
    # No receipt: definitely not executed. Retry with the same key, if still allowed.
    contract = (
        Contract.objects.get(
            tenant=tenant, key=task.contract_key, version=task.contract_version
        )
        if task.contract_key and task.contract_version
        else None
    )
    if contract is None or contract.status == ContractStatus.RETIRED:
        return to_person(
            ReasonCode.CONTRACT_RETIRED,
            why="no retry under a retired contract version",
            receipts=[],
        )
    # The retry runs under the authority of the agent that executed (a person's
    # execution has none recorded: the agent that reserved stands in).
    executor = operation.executed_by_agent_id or operation.agent_id
    if executor is None or not portal_selectors.agent_may(
        tenant=tenant,
        agent_id=executor,
        action=operation.action,
        target=operation.target,
    ):
        return to_person(
            ReasonCode.PERMISSION_REVOKED, agent_id=str(executor), receipts=[]
        )
    if operation.attempts >= claim.connector.max_attempts:
        return to_person(
            ReasonCode.RESULT_UNKNOWN,
            why="retry budget spent",
            attempts=operation.attempts,
            receipts=[],
        )
    authorized = authorize_call(
        tenant=tenant,
        task=task,
        operation=operation,
        connector=claim.connector,
        ttl_s=contract.spec["policy"]["credential_ttl_s"],
        now=db_now(),
        actor=SYSTEM,
        trace=trace,
        receipt_required=contract_receipt_required(contract.spec),
    )
    moved = services.operation_move(
        to=OperationState.EXECUTING,
        reason=None,
        check_in=dt.timedelta(seconds=settings.PORTAL_EXECUTION_DEADLINE_S),
        data={
            "retry": True,
            "jti": str(authorized.credential_id),
            "issued": list(authorized.credentials),
        },
        **common,
    )
    return dataclasses.replace(authorized, operation=moved)


@scope.in_tenants_with("tasks_tenants_with_due_operations")
def unscoped_operations_due(
    *, limit: int = 100
) -> list[tuple[uuid.UUID, uuid.UUID, str]]:
    """(tenant id, operation id, state) of operations due to be settled, oldest first:
    in doubt, or queued and never started.

    Cross-tenant on purpose: the settle job serves every tenant.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT tenant_id, id, state FROM tasks_operation
            WHERE next_check_at <= app_now() AND (
                state IN ('executing', 'unknown')
                OR (state = 'reserved' AND authorized_at IS NOT NULL)
            )
            ORDER BY next_check_at, id LIMIT %s
            """,
            [limit],
        )
        return [(row[0], row[1], row[2]) for row in cursor.fetchall()]
