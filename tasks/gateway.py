"""The action gateway: decide, call at most once per key, prove, or hand to a person.

``operation_execute`` runs the checks of DESIGN.md in order, each writing a
``gateway.checked`` event with its verdict:

1. the pinned contract version is not retired (``CONTRACT_RETIRED``);
2. every required field is present, from the contract's source and fresh enough
   (``FIELD_MISSING``, ``FIELD_SOURCE_MISMATCH``, ``FIELD_STALE``);
3. the target is a contract write target with a connector (``TARGET_FORBIDDEN``);
4. the agent's grant still holds *now* (``PERMISSION_REVOKED``);
5. the object version the task read is the current one (``VERSION_CONFLICT``);
6. a connector without idempotency keys and lookup needs a person's one-time
   approval of this exact input (``APPROVAL_REQUIRED``);
7. a short-lived scoped credential is issued, and checked unexpired right before the
   call (``CREDENTIAL_EXPIRED``).

Then: commit, call the remote system with the operation's key and no transaction
open, and record the answer in a new transaction. Any refusal moves the task to
``human_required`` with an ``Escalation`` holding the evidence. An answer that cannot
be trusted starts the recovery protocol (``operation_recover``): look the receipt up
by key, never mint a new key.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from django.conf import settings
from django.db import connection, transaction

from audit import services as audit_services
from audit.models import EventCode
from audit.redaction import redact_payload
from portal import db as portal_db
from portal import selectors as portal_selectors
from portal.actors import Actor, ActorType
from portal.codes import ReasonCode
from portal.exceptions import LeaseExpired, ValidationFailed
from portal.models import Tenant
from portal.tracing import NO_TRACE, Trace

from . import services
from .connectors import CallResult, LookupResult, RemoteSystem, connector_for
from .credentials import credential_fingerprint, credential_mint
from .exceptions import OperationNotFound
from .models import (
    OPERATION_TRANSITIONS,
    Approval,
    Connector,
    Contract,
    ContractStatus,
    Credential,
    Escalation,
    ObjectVersion,
    Operation,
    OperationState,
    Task,
    TaskState,
)

TestHook = Callable[[str], None]
Outcome = Literal["verified", "failed", "unknown", "conflict", "refused", "queued"]

SYSTEM: Final = Actor.system("gateway")
# A future observed_at beyond this is a clock or provenance problem, not freshness.
MAX_CLOCK_SKEW: Final = dt.timedelta(minutes=5)
LOOKUP_CREDENTIAL_TTL_S: Final = 60
# How long a queued execution may wait for its worker before the settle job runs it.
QUEUED_GRACE_S: Final = 30


class ContractRequired(ValidationFailed):
    """The task pins no contract, so the gateway has nothing to check its fields by."""

    code = "CONTRACT_REQUIRED"
    status = 422


@dataclass(frozen=True, kw_only=True)
class FieldValue:
    """A field the agent read, with its provenance."""

    name: str
    value: Any
    source: str
    observed_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class GatewayResult:
    """What became of an execution request."""

    outcome: Outcome
    operation: Operation
    reason: str | None = None
    escalation_id: uuid.UUID | None = None


@dataclass(frozen=True, kw_only=True)
class _Authorized:
    operation: Operation
    connector: Connector
    credential_id: uuid.UUID
    token: str
    payload: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class _Refused:
    result: GatewayResult


def _db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT app_now()")
        (now,) = cursor.fetchone()
    return now


def _no_hook(point: str) -> None:
    return None


def _lock(
    *, tenant: Tenant, operation_id: uuid.UUID, skip_locked: bool = False
) -> tuple[Task, Operation] | None:
    """Lock an operation's task, then the operation: the one lock order of the app.

    Every writer takes the task row before the operation row (the lease checks in
    services read the task FOR SHARE first too), so two of them can never deadlock.
    With ``skip_locked``, a busy operation returns None instead of waiting.
    """
    portal_db.require_transaction()
    task_id = (
        Operation.objects.filter(tenant=tenant, pk=operation_id)
        .values_list("task_id", flat=True)
        .first()
    )
    if task_id is None:
        return None
    task = Task.objects.select_for_update(of=("self",)).get(tenant=tenant, pk=task_id)
    operation = (
        Operation.objects.select_for_update(of=("self",), skip_locked=skip_locked)
        .filter(tenant=tenant, pk=operation_id)
        .first()
    )
    return (task, operation) if operation is not None else None


# --- Escalation ----------------------------------------------------------------------


def escalate(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation | None,
    reason: ReasonCode,
    evidence: Mapping[str, Any],
    actor: Actor,
    trace: Trace = NO_TRACE,
) -> Escalation:
    """Hand a task to a person, in the caller's transaction.

    The operation (if it can) moves to ``human_required``; the task moves there too
    from pending, running or waiting, losing its automatic lease with a new fencing
    token, so the worker that held it can write nothing more. The evidence is stored
    redacted and bounded.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    if (
        operation is not None
        and (operation.state, OperationState.HUMAN_REQUIRED) in OPERATION_TRANSITIONS
    ):
        operation = services.operation_move(
            tenant=tenant,
            operation_id=operation.pk,
            to=OperationState.HUMAN_REQUIRED,
            expected_version=operation.state_version,
            actor=actor,
            trace=trace,
            reason=reason,
        )
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE tasks_task SET
                state = 'human_required', state_version = state_version + 1,
                reason_code = %s, lease_owner = NULL, lease_acquired_at = NULL,
                lease_expires_at = NULL, lease_token = lease_token + 1,
                updated_at = statement_timestamp()
            WHERE tenant_id = %s AND id = %s
              AND state IN ('pending', 'running', 'waiting')
            RETURNING state_version, lease_token
            """,
            [reason, tenant.pk, task.pk],
        )
        moved = cursor.fetchone()
    record = Escalation.objects.create(
        tenant=tenant,
        task_id=task.pk,
        operation=operation,
        reason_code=reason,
        evidence=redact_payload(evidence),
        responsible_owner=task.lease_owner or actor.id,
    )
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TASK_ESCALATED,
        actor=actor,
        task_id=task.pk,
        operation_id=operation.pk if operation else None,
        reason=reason,
        trace=trace,
        data={
            "escalation_id": str(record.pk),
            "task_moved": moved is not None,
            "lease_token": moved[1] if moved else None,
            "evidence": record.evidence,
        },
    )
    return record


# --- Checks --------------------------------------------------------------------------


def _checked(
    *,
    tenant: Tenant,
    operation: Operation,
    check: str,
    reason: str | None,
    actor: Actor,
    trace: Trace,
    contract: Contract | None,
    **facts: Any,
) -> None:
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.GATEWAY_CHECKED,
        actor=actor,
        task_id=operation.task_id,
        operation_id=operation.pk,
        reason=reason,
        contract=(contract.key, contract.version) if contract else None,
        trace=trace,
        data={"check": check, "verdict": "refused" if reason else "passed", **facts},
        publish=False,
    )


def _field_problems(
    *, spec: Mapping[str, Any], fields: Sequence[FieldValue], now: dt.datetime
) -> tuple[ReasonCode | None, list[dict[str, Any]]]:
    """The first failing category (missing > source > stale) and every problem."""
    given = {field.name: field for field in fields}
    problems: list[dict[str, Any]] = []
    for required in spec["required_fields"]:
        name = required["name"]
        field = given.get(name)
        if field is None:
            problems.append({"field": name, "problem": ReasonCode.FIELD_MISSING})
        elif field.source != required["source"]:
            problems.append(
                {
                    "field": name,
                    "problem": ReasonCode.FIELD_SOURCE_MISMATCH,
                    "expected_source": required["source"],
                    "source": field.source,
                }
            )
        else:
            age = now - field.observed_at
            if age > dt.timedelta(seconds=required["max_age_s"]) or (
                -age > MAX_CLOCK_SKEW
            ):
                problems.append(
                    {
                        "field": name,
                        "problem": ReasonCode.FIELD_STALE,
                        "observed_at": field.observed_at.isoformat(),
                        "age_s": round(age.total_seconds(), 3),
                        "max_age_s": required["max_age_s"],
                    }
                )
    for category in (
        ReasonCode.FIELD_MISSING,
        ReasonCode.FIELD_SOURCE_MISMATCH,
        ReasonCode.FIELD_STALE,
    ):
        if any(problem["problem"] == category for problem in problems):
            return category, problems
    return None, problems


def _plan(operation: Operation, task: Task) -> dict[str, Any]:
    """The agent's proposal, as evidence: what it wanted to do to which object."""
    return {
        "action": operation.action,
        "target": operation.target,
        "idempotency_key": operation.idempotency_key,
        "input_hash": operation.input_hash,
        "object": {
            "type": task.object_type,
            "id": task.object_id,
            "version_read": task.object_version,
        },
        "contract": {"key": task.contract_key, "version": task.contract_version},
    }


def _refuse(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation,
    reason: ReasonCode,
    check: str,
    actor: Actor,
    trace: Trace,
    contract: Contract | None,
    **evidence: Any,
) -> _Refused:
    """Write the failed check's verdict, hand the task to a person, report it."""
    _checked(
        tenant=tenant,
        operation=operation,
        check=check,
        reason=reason,
        actor=actor,
        trace=trace,
        contract=contract,
        **evidence,
    )
    record = escalate(
        tenant=tenant,
        task=task,
        operation=operation,
        reason=reason,
        evidence={"plan": _plan(operation, task), **evidence},
        actor=actor,
        trace=trace,
    )
    operation.refresh_from_db()
    return _Refused(
        result=GatewayResult(
            outcome="refused",
            operation=operation,
            reason=reason,
            escalation_id=record.pk,
        )
    )


@transaction.atomic(durable=True)
def _authorize(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    lease_token: int | None,
    fields: Sequence[FieldValue],
    actor: Actor,
    trace: Trace,
    queue: bool = False,
) -> _Authorized | _Refused | GatewayResult:
    """Run the checks. ``lease_token``: an agent, now. None: a queued run, fenced by
    the token recorded when it was queued. ``queue``: record the authorisation for a
    worker instead of issuing a credential for an immediate call."""
    locked = _lock(tenant=tenant, operation_id=operation_id)
    if locked is None:
        raise OperationNotFound(operation_id=str(operation_id))
    task, operation = locked
    now = _db_now()
    if lease_token is not None and (
        task.lease_token != lease_token
        or task.lease_owner is None
        or task.lease_expires_at is None
        or task.lease_expires_at <= now
    ):
        raise LeaseExpired(operation_id=str(operation_id), lease_token=lease_token)
    if lease_token is None and (
        operation.authorized_token is None
        or task.lease_token != operation.authorized_token
        or task.state not in (TaskState.PENDING, TaskState.RUNNING, TaskState.WAITING)
    ):
        # Taken over (a person, or another worker) since it was queued: whoever
        # holds the task now decides; this run does nothing.
        return GatewayResult(
            outcome=_outcome_of(operation),
            operation=operation,
            reason=ReasonCode.LEASE_EXPIRED,
        )
    if operation.state in (
        OperationState.VERIFIED,
        OperationState.FAILED,
        OperationState.EXECUTING,
        OperationState.UNKNOWN,
        OperationState.CONFLICT,
    ):
        # Executing the same operation again is idempotent: report where it stands.
        return GatewayResult(
            outcome=_outcome_of(operation),
            operation=operation,
            reason=operation.reason_code,
        )
    if task.contract_key is None or task.contract_version is None:
        raise ContractRequired(task_id=str(task.pk))
    contract = Contract.objects.get(
        tenant=tenant, key=task.contract_key, version=task.contract_version
    )
    spec = contract.spec
    context: dict[str, Any] = {
        "tenant": tenant,
        "operation": operation,
        "actor": actor,
        "trace": trace,
        "contract": contract,
    }

    def refuse(reason: ReasonCode, check: str, **evidence: Any) -> _Refused:
        return _refuse(task=task, reason=reason, check=check, **context, **evidence)

    # 1. Contract still in force.
    if contract.status == ContractStatus.RETIRED:
        return refuse(
            ReasonCode.CONTRACT_RETIRED, "contract", contract_status=contract.status
        )
    _checked(check="contract", reason=None, **context)
    # 2. Fields: present, from the right source, fresh.
    reason, problems = _field_problems(spec=spec, fields=fields, now=now)
    if reason is not None:
        return refuse(reason, "fields", conflicting_fields=problems)
    _checked(
        check="fields", reason=None, **context, fields=[field.name for field in fields]
    )
    # 3. Target allowed by the contract, and reachable.
    connector = Connector.objects.filter(tenant=tenant, target=operation.target).first()
    if operation.target not in spec["policy"]["write_targets"] or connector is None:
        return refuse(
            ReasonCode.TARGET_FORBIDDEN,
            "target",
            target=operation.target,
            write_targets=spec["policy"]["write_targets"],
            connector_configured=connector is not None,
        )
    _checked(check="target", reason=None, **context, target=operation.target)
    # 4. Permission, re-checked now.
    if operation.agent_id is None or not portal_selectors.agent_may(
        tenant=tenant,
        agent_id=operation.agent_id,
        action=operation.action,
        target=operation.target,
    ):
        return refuse(
            ReasonCode.PERMISSION_REVOKED,
            "permission",
            agent_id=str(operation.agent_id),
            action=operation.action,
        )
    _checked(check="permission", reason=None, **context)
    # 5. Version fence: what the task read must still be current.
    current = ObjectVersion.objects.filter(
        tenant=tenant, object_type=task.object_type, object_id=task.object_id
    ).first()
    if current is None or current.version != task.object_version:
        return refuse(
            ReasonCode.VERSION_CONFLICT,
            "version",
            version_read=task.object_version,
            current_version=current.version if current else None,
        )
    _checked(check="version", reason=None, **context, version=current.version)
    # 6. A connector that cannot settle doubt needs a person's one-time approval.
    if not connector.automatic_writes:
        used = Approval.objects.filter(
            tenant=tenant,
            operation=operation,
            input_hash=operation.input_hash,
            used_at__isnull=True,
        ).update(used_at=now)
        if not used:
            return refuse(
                ReasonCode.APPROVAL_REQUIRED,
                "approval",
                supports_idempotency_keys=connector.supports_idempotency_keys,
                supports_lookup=connector.supports_lookup,
            )
        _checked(check="approval", reason=None, **context)
    # 7. Credential: scoped to this tenant, object, fields, action and target.
    given = {field.name: field.value for field in fields}
    if operation.call_fields is None:
        read_fields = spec["policy"]["read_fields"]
        operation.call_fields = {
            name: given[name] for name in read_fields if name in given
        }
        Operation.objects.filter(tenant=tenant, pk=operation.pk).update(
            call_fields=operation.call_fields
        )
    if queue:
        Operation.objects.filter(tenant=tenant, pk=operation.pk).update(
            authorized_at=now,
            authorized_token=task.lease_token,
            field_provenance=[
                {
                    "name": f.name,
                    "source": f.source,
                    "observed_at": f.observed_at.isoformat(),
                }
                for f in fields
            ],
            # If the worker's message is lost, the settle job starts it after this.
            next_check_at=now + dt.timedelta(seconds=QUEUED_GRACE_S),
        )
        operation.refresh_from_db()
        return GatewayResult(outcome="queued", operation=operation)
    token, credential = _issue_credential(
        tenant=tenant,
        task=task,
        operation=operation,
        connector=connector,
        ttl_s=spec["policy"]["credential_ttl_s"],
        field_names=sorted(operation.call_fields),
        action=operation.action,
        now=now,
        actor=actor,
        trace=trace,
    )
    return _Authorized(
        operation=operation,
        connector=connector,
        credential_id=credential.pk,
        token=token,
        payload=_payload(operation, task),
    )


def _payload(operation: Operation, task: Task) -> dict[str, Any]:
    """The request body: a pure function of the operation, so retries send the same."""
    body = (
        dict(operation.input)
        if isinstance(operation.input, dict)
        else {"input": operation.input}
    )
    body["object"] = {"type": task.object_type, "id": task.object_id}
    body["fields"] = operation.call_fields or {}
    return body


def _issue_credential(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation,
    connector: Connector,
    ttl_s: int,
    field_names: list[str],
    action: str,
    now: dt.datetime,
    actor: Actor,
    trace: Trace,
) -> tuple[str, Credential]:
    expires_at = now + dt.timedelta(seconds=ttl_s)
    credential = Credential(
        tenant=tenant,
        operation=operation,
        object_type=task.object_type,
        object_id=task.object_id,
        fields=field_names,
        action=action,
        target=operation.target,
        expires_at=expires_at,
    )
    token = credential_mint(
        claims={
            "tenant": str(tenant.pk),
            "object_type": task.object_type,
            "object_id": task.object_id,
            "fields": field_names,
            "action": action,
            "target": operation.target,
            "exp": int(expires_at.timestamp()),
            "jti": str(credential.pk),
        },
        key=connector.signing_key,
    )
    credential.secret_hash = credential_fingerprint(token)
    credential.save(force_insert=True)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.CREDENTIAL_ISSUED,
        actor=actor,
        task_id=task.pk,
        operation_id=operation.pk,
        trace=trace,
        data={
            "credential_id": str(credential.pk),
            "action": action,
            "target": operation.target,
            "fields": field_names,
            "expires_at": expires_at.isoformat(),
            "ttl_s": ttl_s,
        },
        publish=False,
    )
    return token, credential


@transaction.atomic(durable=True)
def _begin_call(
    *,
    tenant: Tenant,
    authorized: _Authorized,
    lease_token: int | None,
    actor: Actor,
    trace: Trace,
) -> Operation | _Refused:
    """Right before the call, check again what time can change; then ``executing``.

    The credential must still be live (``CREDENTIAL_EXPIRED``) and the object version
    still the one the task read (``VERSION_CONFLICT``): both may have changed since
    the checks committed. What remains is the moment between this commit and the
    request leaving; a remote system that takes a version precondition closes it.
    """
    locked = _lock(tenant=tenant, operation_id=authorized.operation.pk)
    assert locked is not None
    task, operation = locked
    if operation.state_version != authorized.operation.state_version:
        # A concurrent delivery of this execution got here first and is calling:
        # report its progress rather than call a second time.
        return _Refused(
            result=GatewayResult(
                outcome=_outcome_of(operation),
                operation=operation,
                reason=operation.reason_code,
            )
        )
    operation = authorized.operation
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT expires_at > app_now() AND revoked_at IS NULL "
            "FROM tasks_credential WHERE tenant_id = %s AND id = %s",
            [tenant.pk, authorized.credential_id],
        )
        (live,) = cursor.fetchone()
    current = ObjectVersion.objects.filter(
        tenant=tenant, object_type=task.object_type, object_id=task.object_id
    ).first()
    problem: tuple[ReasonCode, str, dict[str, Any]] | None = None
    if not live:
        problem = (
            ReasonCode.CREDENTIAL_EXPIRED,
            "credential",
            {"credential_id": str(authorized.credential_id)},
        )
    elif current is None or current.version != task.object_version:
        problem = (
            ReasonCode.VERSION_CONFLICT,
            "version",
            {
                "version_read": task.object_version,
                "current_version": current.version if current else None,
                "when": "between the checks and the call",
            },
        )
    if problem is not None:
        reason, check, evidence = problem
        operation.refresh_from_db()
        return _refuse(
            tenant=tenant,
            task=task,
            operation=operation,
            reason=reason,
            check=check,
            actor=actor,
            trace=trace,
            contract=None,
            **evidence,
        )
    _checked(
        tenant=tenant,
        operation=operation,
        check="credential",
        reason=None,
        actor=actor,
        trace=trace,
        contract=None,
        credential_id=str(authorized.credential_id),
    )
    deadline = dt.timedelta(seconds=settings.PORTAL_EXECUTION_DEADLINE_S)
    return services.operation_move(
        tenant=tenant,
        operation_id=operation.pk,
        to=OperationState.EXECUTING,
        lease_token=lease_token,
        expected_version=None if lease_token is not None else operation.state_version,
        actor=actor,
        trace=trace,
        check_in=deadline,
    )


def _backoff(attempt: int) -> dt.timedelta:
    base = settings.PORTAL_RECOVERY_BACKOFF_S
    return dt.timedelta(seconds=min(base * 2 ** max(attempt - 1, 0), 300))


@transaction.atomic(durable=True)
def _record_call(
    *,
    tenant: Tenant,
    operation: Operation,
    result: CallResult,
    confirmation: LookupResult | None,
    actor: Actor,
    trace: Trace,
) -> Operation:
    """Write what the call did, in a new transaction; one event for the call itself.

    A success is ``verified`` only when its receipt stands alone: if the receipt
    lookup (``confirmation``) shows several receipts for the key, or none that match,
    the answer is not evidence and the operation goes to ``conflict`` or recovery.
    """
    _lock(tenant=tenant, operation_id=operation.pk)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.CONNECTOR_CALLED,
        actor=actor,
        task_id=operation.task_id,
        operation_id=operation.pk,
        trace=trace,
        data={"attempt": operation.attempts, **result.as_event_data()},
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
            data={
                "outcome": confirmation.kind,
                "receipts": confirmation.references[:10],
                "count": len(confirmation.references),
                "purpose": "confirm",
                "error": confirmation.error[:200],
            },
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
            escalate(
                tenant=tenant,
                task=task,
                operation=conflicted,
                reason=ReasonCode.MULTIPLE_RECEIPTS,
                actor=actor,
                trace=trace,
                evidence={
                    "plan": _plan(conflicted, task),
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
            result=result.body,
            data={
                "confirmed": confirmation is not None and confirmation.kind == "found"
            },
            **common,
        )
    if result.kind == "rejected":
        return services.operation_move(
            to=OperationState.FAILED,
            result=result.body or {"status": result.status},
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


_OUTCOMES: Final[dict[str, Outcome]] = {
    OperationState.VERIFIED: "verified",
    OperationState.FAILED: "failed",
    OperationState.CONFLICT: "conflict",
    OperationState.HUMAN_REQUIRED: "refused",
}


def _outcome_of(operation: Operation) -> Outcome:
    return _OUTCOMES.get(operation.state, "unknown")


def _call(
    *,
    tenant: Tenant,
    authorized: _Authorized,
    operation: Operation,
    actor: Actor,
    trace: Trace,
    hook: TestHook,
    remote: RemoteSystem | None = None,
) -> Operation:
    """Call with no transaction open, then record the answer."""
    portal_db.forbid_transaction("the gateway calls the remote system")
    remote = remote or connector_for(authorized.connector)
    result = remote.execute(
        idempotency_key=operation.idempotency_key,
        credential=authorized.token,
        payload=authorized.payload,
    )
    hook("after_call")
    confirmation = None
    if (
        result.kind == "succeeded"
        and remote.supports_lookup
        and (_receipt_required(operation))
    ):
        confirmation = remote.lookup(
            idempotency_key=operation.idempotency_key, credential=authorized.token
        )
    return _record_call(
        tenant=tenant,
        operation=operation,
        result=result,
        confirmation=confirmation,
        actor=actor,
        trace=trace,
    )


def _receipt_required(operation: Operation) -> bool:
    """Whether the pinned contract asks for a verified receipt (the seed's default)."""
    task = Task.objects.only("tenant_id", "contract_key", "contract_version").get(
        tenant_id=operation.tenant_id, pk=operation.task_id
    )
    if task.contract_key is None or task.contract_version is None:
        return True
    contract = Contract.objects.only("spec").get(
        tenant_id=task.tenant_id, key=task.contract_key, version=task.contract_version
    )
    return bool(contract.spec["receipt"]["required"])


def operation_execute(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    lease_token: int,
    fields: Sequence[FieldValue],
    actor: Actor,
    trace: Trace = NO_TRACE,
    queue: bool = False,
    _test_hook: TestHook = _no_hook,
) -> GatewayResult:
    """Check, call at most once per key, and record; or hand the task to a person.

    Guarantee: the remote system is called only after every check passed and their
    verdicts committed; no transaction is open during the call; the call carries the
    operation's own idempotency key, on retries too. Calling this again for the same
    operation reports where it stands instead of calling again.

    With ``queue``, the checks run now and their verdict commits (outcome
    ``queued``); ``operation_run_queued`` on a worker makes the call later.

    Raises:
        OperationNotFound: no such operation in the tenant.
        LeaseExpired: the caller's lease token is not current.
        ContractRequired: the task pins no contract.
    """
    portal_db.forbid_transaction("the gateway calls the remote system")
    plan = _authorize(
        tenant=tenant,
        operation_id=operation_id,
        lease_token=lease_token,
        fields=fields,
        actor=actor,
        trace=trace,
        queue=queue,
    )
    return _run(
        tenant=tenant,
        plan=plan,
        lease_token=lease_token,
        actor=actor,
        trace=trace,
        hook=_test_hook,
    )


def operation_run_queued(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    trace: Trace = NO_TRACE,
    _test_hook: TestHook = _no_hook,
) -> GatewayResult:
    """Make the call of an execution that was queued, on a worker; safe to repeat.

    Everything time can change is checked again first: the contract, the fields'
    age (from the recorded provenance), the target, the agent's grant, the object
    version, and that nobody took the task over since it was queued. A second run of
    the same message finds the operation no longer ``reserved`` and does nothing;
    a run killed after the call is settled by the receipt lookup, never by a call.
    """
    portal_db.forbid_transaction("the gateway calls the remote system")
    operation = Operation.objects.get(tenant=tenant, pk=operation_id)
    if operation.state != OperationState.RESERVED or operation.authorized_at is None:
        return GatewayResult(
            outcome=_outcome_of(operation),
            operation=operation,
            reason=operation.reason_code,
        )
    values = operation.call_fields or {}
    fields = [
        FieldValue(
            name=item["name"],
            value=values.get(item["name"]),
            source=item["source"],
            observed_at=dt.datetime.fromisoformat(item["observed_at"]),
        )
        for item in operation.field_provenance or []
    ]
    actor = (
        Actor(type=ActorType.AGENT, id=str(operation.agent_id))
        if operation.agent_id
        else SYSTEM
    )
    plan = _authorize(
        tenant=tenant,
        operation_id=operation_id,
        lease_token=None,
        fields=fields,
        actor=actor,
        trace=trace,
    )
    return _run(
        tenant=tenant,
        plan=plan,
        lease_token=None,
        actor=actor,
        trace=trace,
        hook=_test_hook,
    )


def _run(
    *,
    tenant: Tenant,
    plan: _Authorized | _Refused | GatewayResult,
    lease_token: int | None,
    actor: Actor,
    trace: Trace,
    hook: TestHook,
) -> GatewayResult:
    """After the checks: the last-moment checks, the call, the verdict, one look."""
    if isinstance(plan, GatewayResult):
        return plan
    if isinstance(plan, _Refused):
        return plan.result
    hook("before_call")
    started = _begin_call(
        tenant=tenant,
        authorized=plan,
        lease_token=lease_token,
        actor=actor,
        trace=trace,
    )
    if isinstance(started, _Refused):
        return started.result
    operation = _call(
        tenant=tenant,
        authorized=plan,
        operation=started,
        actor=actor,
        trace=trace,
        hook=hook,
    )
    if (
        operation.state == OperationState.UNKNOWN
        and operation.next_check_at is not None
    ):
        # One look right away; the settle job keeps looking after that.
        recovered = operation_recover(
            tenant=tenant, operation_id=operation.pk, trace=trace
        )
        operation = recovered.operation
    operation.refresh_from_db()
    return GatewayResult(
        outcome=_outcome_of(operation),
        operation=operation,
        reason=operation.reason_code,
    )


# --- Recovery ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Lookup:
    operation: Operation
    task: Task
    connector: Connector
    token: str


@transaction.atomic(durable=True)
def _recovery_claim(
    *, tenant: Tenant, operation_id: uuid.UUID, trace: Trace
) -> _Lookup | GatewayResult | None:
    """Claim an operation in doubt for one recovery look, or settle it without one."""
    locked = _lock(tenant=tenant, operation_id=operation_id, skip_locked=True)
    if locked is None:
        return None  # another runner holds it, or it is gone
    task, operation = locked
    now = _db_now()
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
        return GatewayResult(
            outcome=_outcome_of(operation),
            operation=operation,
            reason=operation.reason_code,
        )
    connector = Connector.objects.filter(tenant=tenant, target=operation.target).first()
    if connector is None or not connector.supports_lookup:
        record = escalate(
            tenant=tenant,
            task=task,
            operation=operation,
            reason=ReasonCode.RESULT_UNKNOWN,
            actor=SYSTEM,
            trace=trace,
            evidence={
                "plan": _plan(operation, task),
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
    token, _ = _issue_credential(
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
    )
    return _Lookup(operation=operation, task=task, connector=connector, token=token)


def operation_recover(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    trace: Trace = NO_TRACE,
    _test_hook: TestHook = _no_hook,
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
    claim = _recovery_claim(tenant=tenant, operation_id=operation_id, trace=trace)
    if claim is None:
        operation = Operation.objects.get(tenant=tenant, pk=operation_id)
        return GatewayResult(outcome=_outcome_of(operation), operation=operation)
    if isinstance(claim, GatewayResult):
        return claim
    remote = remote or connector_for(claim.connector)
    lookup = remote.lookup(
        idempotency_key=claim.operation.idempotency_key, credential=claim.token
    )
    _test_hook("after_lookup")
    decision = _recovery_decide(tenant=tenant, claim=claim, lookup=lookup, trace=trace)
    if not isinstance(decision, _Authorized):
        return decision
    operation = _call(
        tenant=tenant,
        authorized=decision,
        operation=decision.operation,
        actor=SYSTEM,
        trace=trace,
        hook=_test_hook,
        remote=remote,
    )
    return GatewayResult(
        outcome=_outcome_of(operation),
        operation=operation,
        reason=operation.reason_code,
    )


@transaction.atomic(durable=True)
def _recovery_decide(
    *, tenant: Tenant, claim: _Lookup, lookup: LookupResult, trace: Trace
) -> GatewayResult | _Authorized:
    locked = _lock(tenant=tenant, operation_id=claim.operation.pk)
    assert locked is not None  # operations are never deleted while in doubt
    task, operation = locked
    if operation.state_version != claim.operation.state_version:
        return GatewayResult(outcome=_outcome_of(operation), operation=operation)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.RECEIPT_QUERIED,
        actor=SYSTEM,
        task_id=task.pk,
        operation_id=operation.pk,
        trace=trace,
        data={
            "outcome": lookup.kind,
            "receipts": lookup.references[:10],
            "count": len(lookup.references),
            "status": lookup.status,
            "error": lookup.error[:200],
            "lookup": operation.lookups + 1,
        },
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
        record = escalate(
            tenant=tenant,
            task=task,
            operation=operation,
            reason=reason,
            evidence={"plan": _plan(operation, task), **evidence},
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
        record = escalate(
            tenant=tenant,
            task=task,
            operation=moved,
            reason=ReasonCode.MULTIPLE_RECEIPTS,
            actor=SYSTEM,
            trace=trace,
            evidence={"plan": _plan(moved, task), "receipts": lookup.references},
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
            next_check_at=_db_now() + _backoff(operation.lookups + 1),
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
    if operation.agent_id is None or not portal_selectors.agent_may(
        tenant=tenant,
        agent_id=operation.agent_id,
        action=operation.action,
        target=operation.target,
    ):
        return to_person(ReasonCode.PERMISSION_REVOKED, receipts=[])
    if operation.attempts >= claim.connector.max_attempts:
        return to_person(
            ReasonCode.RESULT_UNKNOWN,
            why="retry budget spent",
            attempts=operation.attempts,
            receipts=[],
        )
    token, credential = _issue_credential(
        tenant=tenant,
        task=task,
        operation=operation,
        connector=claim.connector,
        ttl_s=contract.spec["policy"]["credential_ttl_s"],
        field_names=sorted(operation.call_fields or {}),
        action=operation.action,
        now=_db_now(),
        actor=SYSTEM,
        trace=trace,
    )
    moved = services.operation_move(
        to=OperationState.EXECUTING,
        reason=None,
        check_in=dt.timedelta(seconds=settings.PORTAL_EXECUTION_DEADLINE_S),
        data={"retry": True},
        **common,
    )
    return _Authorized(
        operation=moved,
        connector=claim.connector,
        credential_id=credential.pk,
        token=token,
        payload=_payload(moved, task),
    )


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
