"""One governed action in one call: register or find, lease, reserve, execute, settle.

``action_take`` is what ``POST /api/v1/actions`` (and the MCP server's tool calls)
run. It composes the six-call lifecycle's services (``services.task_register``,
which also claims the task it registers, or ``task_lease_acquire`` and
``task_transition`` for a task registered before; ``operation_reserve``, then the
gateway through ``dispatch.operation_dispatch``) and adds no business rule of its
own: the checks, the call, the receipt and the hand-over to a person are the
gateway's.

Identity: the request's ``idempotency_key`` is the operation's key (the business
identity of the side effect). The task is registered under a client task id derived
from it (``client_task_id_for``), so a retry finds the same task and the same
operation, and the remote system is called at most once per key.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from django.db import connection

from audit import selectors as audit_selectors
from audit.models import EventCode
from portal import db as portal_db
from portal import selectors as portal_selectors
from portal.actors import Actor
from portal.db import db_now
from portal.exceptions import (
    IllegalTransition,
    LeaseExpired,
    PortalError,
    StaleState,
    ValidationFailed,
)
from portal.models import Agent, Tenant
from portal.tracing import NO_TRACE, Trace

from . import dispatch, gateway, selectors, services
from .exceptions import (
    ActionInFlight,
    ActionNotGranted,
    ContractNotFound,
    IdempotencyKeyReused,
    LeaseHeld,
    TaskIdReused,
    TaskNotLeasable,
)
from .gateway.common import TestHook, no_hook
from .models import (
    Contract,
    ContractStatus,
    Escalation,
    Operation,
    OperationState,
    Task,
    TaskState,
)
from .services.operations import OPERATION_ATTNAMES, OPERATION_COLUMNS

Status = Literal[
    "verified", "refused", "human_required", "unknown", "accepted", "failed"
]
"""What an action came to, for the agent:

- ``verified``: done, the receipt (``provider_reference``) proves it;
- ``refused``: a gateway check refused before any call (``reason_code``,
  ``failed_check``, ``failed_fields``); the task waits for a person
  (``desk_item_id``); do not retry with a new key;
- ``human_required``: a person must decide (after the call, or already with one);
- ``unknown``: the call's result is in doubt (or the call is under way); the portal
  looks the receipt up by key; poll ``status_url`` or repeat the same call;
- ``accepted``: queued for a worker (``respond_async``); poll ``status_url``;
- ``failed``: the remote system rejected the action; this key is spent.
"""

# The owner name of the lease an action call holds while it works.
LEASE_OWNER_PREFIX: Final = "action:"
# How long that lease lives: the call renews nothing, so it outlives a slow remote
# call (the connector's timeout is far shorter) and lapses soon after a crash.
LEASE_TTL_S: Final = 120
# What a caller that found the same key in flight is told to wait, in seconds.
IN_FLIGHT_RETRY_AFTER_S: Final = 1


@dataclass(frozen=True, kw_only=True)
class FieldRead:
    """One field the agent read: its value, where from, and when."""

    value: Any
    source: str
    read_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class ActionRequest:
    """One governed action, whole.

    ``idempotency_key`` is the side effect's business identity (the operation key,
    e.g. ``ticket-for-issue-1042``); ``arguments`` is the operation's input (hashed
    with RFC 8785 + SHA-256). The same key with the same action, target, object and
    arguments is the same action; the field reads may differ between retries (a
    retry reads again), they are checked fresh by the gateway each time.

    ``contract_key`` (and ``contract_version``) pin the field contract; omitted, the
    tenant's one published contract for ``object_type`` that lists ``target`` as a
    write target is pinned. ``workflow_key`` defaults to the action;
    ``client_task_id`` to one derived from the key (``client_task_id_for``): give
    your own to name the task as a six-call client would (``issue-1042``), and the
    same one on every retry.
    """

    action: str
    target: str
    object_type: str
    object_id: str
    object_version: str
    fields: Mapping[str, FieldRead]
    arguments: Any
    idempotency_key: str
    contract_key: str | None = None
    contract_version: int | None = None
    workflow_key: str | None = None
    workflow_version: str = "1"
    client_task_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ActionOutcome:
    """What became of the action: an answer the agent can act on without guessing.

    ``next_step`` says what to do in words; ``status_url`` is the operation's
    detail (``/api/v1/operations/{id}``) to poll. ``created`` is True when this call
    reserved the operation (False: an earlier call with the same key did).
    """

    status: Status
    operation_id: uuid.UUID
    task_id: uuid.UUID
    operation_state: str
    task_state: str
    next_step: str
    status_url: str
    created: bool = False
    reason_code: str | None = None
    failed_check: str | None = None
    failed_fields: tuple[str, ...] = ()
    provider_reference: str | None = None
    result: Mapping[str, Any] | None = None
    desk_item_id: uuid.UUID | None = None
    attempts: int = 0
    # For a refusal: the desk item's facts on each failed field (names, sources,
    # read times, ages; never values), as the gateway recorded them.
    details: Mapping[str, Any] = field(default_factory=dict)


def client_task_id_for(idempotency_key: str) -> str:
    """The client task id a one-call action registers its task under.

    Derived from the action key alone, so every retry finds the same task. A digest,
    not the key itself: it fits the column whatever the key's length, and a
    six-call client's own ``client_task_id`` (``issue-1042``) cannot collide with it.
    """
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]
    return f"action-{digest}"


def status_url_of(operation_id: uuid.UUID) -> str:
    """Where the agent polls the operation (``GET /api/v1/operations/{id}``)."""
    return f"/api/v1/operations/{operation_id}"


_NEXT_STEPS: Final[dict[str, str]] = {
    "verified": "Done: the receipt proves it. Repeating this call answers the same.",
    "refused": (
        "A check refused the action before any call; the task waits for a person "
        "(desk_item_id). Do not retry with a new key; poll status_url or wait."
    ),
    "human_required": (
        "A person must decide (desk_item_id). Do not retry with a new key; poll "
        "status_url or wait."
    ),
    "unknown": (
        "The result is in doubt; the portal looks the receipt up by key. Do not "
        "retry with a new key; poll status_url or repeat this same call later."
    ),
    "accepted": (
        "Queued: a worker makes the call. Poll status_url, or repeat this same "
        "call to settle the task once the operation is verified."
    ),
    "failed": (
        "The remote system rejected the action; this key is spent. A new attempt "
        "is a new side effect: decide before using a new key."
    ),
}

# The outcome an operation's state stands for, once the task is settled or not.
_STATUS_OF_OPERATION: Final[dict[str, Status]] = {
    OperationState.VERIFIED: "verified",
    OperationState.FAILED: "failed",
    OperationState.CONFLICT: "human_required",
    OperationState.HUMAN_REQUIRED: "human_required",
    OperationState.EXECUTING: "unknown",
    OperationState.UNKNOWN: "unknown",
}
_WITH_A_PERSON: Final = (TaskState.HUMAN_REQUIRED, TaskState.HUMAN_CLAIMED)
_ENDED: Final = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)


def action_take(
    *,
    agent: Agent,
    request: ActionRequest,
    respond_async: bool = False,
    trace: Trace = NO_TRACE,
    _test_hook: TestHook = no_hook,
) -> ActionOutcome:
    """Take one governed action: register or find the task, lease it, reserve the
    operation, let the gateway check, call and verify, then settle the task.

    Guarantee: the remote system is called at most once per ``idempotency_key``
    (the gateway's guarantee); no transaction is open during the call; every step
    commits on its own, so a crash anywhere is finished by repeating the same call.
    Repeating a settled action answers the stored outcome without a lease and
    without calling out. On ``verified`` the task is ``succeeded``; on a refusal or
    ``human_required`` the task waits for a person (the gateway moved it); on
    ``failed`` the task is ``failed``; on ``unknown`` the lease is given back and
    recovery settles the operation (repeat the call to settle the task).

    With ``respond_async`` the checks run now and a worker makes the call
    (``accepted``); the lease is given back without a new fencing token, so the
    worker's run stays authorised, and repeating the call once the operation is
    verified settles the task.

    A call that finds another call with the same key holding the task (its lease
    live) raises ``ActionInFlight`` rather than answering mid-way.

    Raises:
        IdempotencyKeyReused: the key was used for another action (another action,
            target, object or arguments); nothing was executed.
        ActionInFlight: another call with the same key holds the task right now.
        ActionNotGranted: the agent holds no grant for the action and target.
        ContractNotFound: no such published contract (or none to infer).
        ContractRetired: the contract version is retired.
        ValidationFailed: the request is not valid (e.g. several contracts fit).
        SensitiveValue: an identifier carries a secret or personal data.
    """
    portal_db.forbid_transaction("an action's gateway calls the remote system")
    tenant = agent.tenant
    actor = Actor.of_agent(agent)
    # The grant first, before anything is written (operation_reserve checks it
    # again, every time).
    granted, operation = _grant_and_operation(
        tenant=tenant, agent=agent, request=request
    )
    if not granted:
        raise ActionNotGranted(action=request.action, target=request.target)
    claimed = False  # this call registered the task, and holds its lease
    if operation is not None:
        # Made before, by an earlier call (or a six-call client): its own task.
        task = selectors.task_get(tenant=tenant, task_id=operation.task_id)
        # Read again, after the task: a call settles the operation before its task,
        # so an operation read before the task may be older than it (executing,
        # while the task already succeeded) and would answer 'unknown'.
        operation.refresh_from_db()
        _require_same_action(
            tenant=tenant, request=request, task=task, operation=operation, actor=actor
        )
    else:
        registration = _register(
            tenant=tenant, request=request, agent=agent, actor=actor, trace=trace
        )
        task, claimed = registration.task, registration.created
    if operation is not None and not _needs_the_lease(task, operation):
        if operation.state == OperationState.EXECUTING and _lease_live(task):
            # The call that holds the task is making the remote call right now.
            raise ActionInFlight(retry_after_s=IN_FLIGHT_RETRY_AFTER_S)
        return _answer(tenant=tenant, task=task, operation=operation, created=False)

    leased = (
        task if claimed else _lease(tenant=tenant, task=task, agent=agent, trace=trace)
    )
    if leased is None:  # moved on while this call looked: answer where it stands
        task = selectors.task_get(tenant=tenant, task_id=task.pk)
        # The operation as it stands now, read after the task (as above).
        operation = selectors.operation_get_by_key(
            tenant=tenant, idempotency_key=request.idempotency_key
        )
        if operation is None:  # a person took the task before anything was reserved
            raise TaskNotLeasable(task_id=str(task.pk), state=task.state)
        return _answer(tenant=tenant, task=task, operation=operation, created=False)
    task, lease_token = leased, leased.lease_token
    try:
        reservation = services.operation_reserve(
            tenant=tenant,
            task_id=task.pk,
            lease_token=lease_token,
            idempotency_key=request.idempotency_key,
            action=request.action,
            target=request.target,
            input=request.arguments,
            actor=actor,
            trace=trace,
        )
    except PortalError:
        _release(tenant=tenant, task=task, lease_token=lease_token, actor=actor)
        raise
    operation, created = reservation.operation, reservation.created
    _test_hook("after_reserve")
    if operation.state in (OperationState.RESERVED, OperationState.HUMAN_REQUIRED):
        result = dispatch.operation_dispatch(
            tenant=tenant,
            operation_id=operation.pk,
            lease_token=lease_token,
            fields=[
                gateway.FieldValue(
                    name=name,
                    value=read.value,
                    source=read.source,
                    observed_at=read.read_at,
                )
                for name, read in request.fields.items()
            ],
            actor=actor,
            trace=trace,
            respond_async=respond_async,
        )
        _test_hook("after_execute")
        # As the gateway left it: read after its last write.
        operation = result.operation
        if result.outcome == "queued":
            # Given back without a new token: the queued run is fenced by this
            # token, and a repeat of this call answers "accepted" without a lease.
            _release(tenant=tenant, task=task, lease_token=lease_token, actor=actor)
            task = selectors.task_get(tenant=tenant, task_id=task.pk)
            return _answer(
                tenant=tenant,
                task=task,
                operation=operation,
                created=created,
                status="accepted",
            )
    else:
        # Reserved before (a repeat that settles it): it may have moved since.
        operation.refresh_from_db()
    task = _settle(
        tenant=tenant,
        task=task,
        operation=operation,
        lease_token=lease_token,
        actor=actor,
        trace=trace,
    )
    return _answer(tenant=tenant, task=task, operation=operation, created=created)


# The agent's grant and the key's operation (if any) in one statement: the start of
# every call, new key or repeat (one round trip and one transaction, not two).
_GRANT_AND_OPERATION: Final = f"""
SELECT {portal_selectors.AGENT_MAY_EXISTS}, {OPERATION_COLUMNS}
FROM (SELECT) AS one
LEFT JOIN tasks_operation AS o
    ON o.tenant_id = %(tenant_id)s AND o.idempotency_key = %(key)s
"""


def _grant_and_operation(
    *, tenant: Tenant, agent: Agent, request: ActionRequest
) -> tuple[bool, Operation | None]:
    """Whether the agent may take the action on the target (``agent_may``), and the
    operation the request's idempotency key names, if an earlier call made one."""
    with connection.cursor() as cursor:
        cursor.execute(
            _GRANT_AND_OPERATION,
            {
                "tenant_id": tenant.pk,
                "agent_id": agent.pk,
                "action": request.action,
                "target": request.target,
                "key": request.idempotency_key,
            },
        )
        row = cursor.fetchone()
    assert row is not None  # the FROM is one row
    operation = portal_db.joined_model_from_row(Operation, OPERATION_ATTNAMES, row[1:])
    return bool(row[0]), operation


def _contract_of(*, tenant: Tenant, request: ActionRequest) -> tuple[str, int | None]:
    """The contract to pin: the request's, or the one published contract for the
    object type that lists the target as a write target.

    Raises:
        ContractNotFound: none fits.
        ValidationFailed: several fit; the request must name one.
    """
    if request.contract_key is not None:
        return request.contract_key, request.contract_version
    fitting: set[str] = {
        contract.key
        for contract in selectors.contract_list(tenant=tenant).filter(
            status=ContractStatus.PUBLISHED
        )
        if _fits(contract, request)
    }
    if not fitting:
        raise ContractNotFound(object_type=request.object_type, target=request.target)
    if len(fitting) > 1:
        raise ValidationFailed(
            "Several contracts fit this object type and target; name one.",
            field="contract_key",
            contracts=sorted(fitting),
        )
    return fitting.pop(), None


def _fits(contract: Contract, request: ActionRequest) -> bool:
    spec = contract.spec
    return spec.get("object_type") == request.object_type and request.target in (
        spec.get("policy", {}).get("write_targets", [])
    )


def _register(
    *, tenant: Tenant, request: ActionRequest, agent: Agent, actor: Actor, trace: Trace
) -> services.Registration:
    """Register the action's task, or find the one an earlier call registered.

    A task this call registers is claimed in the same transaction (running, under
    this call's lease: ``task_register(claim_owner=…)``), one transaction where the
    lease and the move to ``running`` took two more. A task found is returned as
    stored, for ``_lease``.

    Raises:
        TaskIdReused: the key was used for another object (IDEMPOTENCY_KEY_REUSED).
    """
    client_task_id = request.client_task_id or client_task_id_for(
        request.idempotency_key
    )
    contract_key, contract_version = _contract_of(tenant=tenant, request=request)
    register = functools.partial(
        services.task_register,
        tenant=tenant,
        actor=actor,
        client_task_id=client_task_id,
        workflow_key=request.workflow_key or request.action,
        workflow_version=request.workflow_version,
        object_type=request.object_type,
        object_id=request.object_id,
        object_version=request.object_version,
        contract_key=contract_key,
        claim_owner=_lease_owner(agent),
        claim_ttl_s=LEASE_TTL_S,
        trace=trace,
    )
    try:
        return register(contract_version=contract_version)
    except (TaskIdReused, ContractNotFound):
        if contract_version is not None:
            raise
        # A retry keeps the version its first call pinned, even after a newer one
        # was published (or the pinned one retired); looked up only then, so a
        # new key costs no read of it.
        earlier = (
            Task.objects.filter(tenant=tenant, client_task_id=client_task_id)
            .only("contract_key", "contract_version")
            .first()
        )
        if earlier is None or earlier.contract_key != contract_key:
            raise
        return register(contract_version=earlier.contract_version)


def _require_same_action(
    *,
    tenant: Tenant,
    request: ActionRequest,
    task: Task,
    operation: Operation,
    actor: Actor,
) -> None:
    """The key's operation must be this very action: same action, target, object and
    arguments (the arguments compared by operation_reserve's own hash rule).

    Raises:
        IdempotencyKeyReused: it is another action; nothing is written.
    """
    if (operation.action, operation.target) != (request.action, request.target) or (
        task.object_type,
        task.object_id,
        task.object_version,
    ) != (request.object_type, request.object_id, request.object_version):
        raise IdempotencyKeyReused(idempotency_key=request.idempotency_key)
    # Same key and input: the stored operation, lease or not; another input raises.
    services.operation_reserve(
        tenant=tenant,
        task_id=task.pk,
        lease_token=task.lease_token,
        idempotency_key=request.idempotency_key,
        action=request.action,
        target=request.target,
        input=request.arguments,
        actor=actor,
    )


def _needs_the_lease(task: Task, operation: Operation | None) -> bool:
    """Whether this call has work to do under the task's lease.

    Nothing to do when the task is with a person or ended, or when the operation is
    in doubt, queued for a worker, or settled with the task already settled too.
    """
    if task.state in _WITH_A_PERSON or task.state in _ENDED:
        return False
    if operation is None:
        return True
    if operation.state == OperationState.RESERVED:
        return operation.authorized_at is None  # queued: the worker's now
    if operation.state == OperationState.HUMAN_REQUIRED:
        return True  # a person handed the task back: execute again, same key
    # Settled but the task is not (the call that made it ended first): settle it.
    return operation.state in (OperationState.VERIFIED, OperationState.FAILED)


def _lease_live(task: Task) -> bool:
    """Whether someone holds the task's lease right now (on the database clock)."""
    return (
        task.lease_owner is not None
        and task.lease_expires_at is not None
        and task.lease_expires_at > db_now()
    )


def _lease_owner(agent: Agent) -> str:
    return f"{LEASE_OWNER_PREFIX}{agent.pk}"


def _lease(*, tenant: Tenant, task: Task, agent: Agent, trace: Trace) -> Task | None:
    """Take the task's lease and make it running; None when the task moved on (a
    person took it, it ended) before the lease was taken.

    Raises:
        ActionInFlight: another call holds the lease.
    """
    actor = Actor.of_agent(agent)
    try:
        leased = services.task_lease_acquire(
            tenant=tenant,
            task_id=task.pk,
            owner=_lease_owner(agent),
            ttl_s=LEASE_TTL_S,
            actor=actor,
            trace=trace,
        )
    except LeaseHeld:
        raise ActionInFlight(retry_after_s=IN_FLIGHT_RETRY_AFTER_S) from None
    except TaskNotLeasable:
        return None
    if leased.state == TaskState.PENDING:
        leased = services.task_transition(
            tenant=tenant,
            task_id=leased.pk,
            to=TaskState.RUNNING,
            expected_version=leased.state_version,
            lease_token=leased.lease_token,
            actor=actor,
            trace=trace,
            step="action_claimed",
        )
    return leased


def _release(*, tenant: Tenant, task: Task, lease_token: int, actor: Actor) -> None:
    """Give the lease back (running -> pending); already gone is fine."""
    with contextlib.suppress(LeaseExpired, StaleState):
        services.task_lease_release(
            tenant=tenant, task_id=task.pk, lease_token=lease_token, actor=actor
        )


def _settle(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation,
    lease_token: int,
    actor: Actor,
    trace: Trace,
) -> Task:
    """Move the task after its operation: succeeded on verified, failed on failed,
    the lease given back while the result is in doubt. A refusal or a person's
    turn needs nothing: the gateway already moved the task to the desk.

    ``task`` is the task as this call leased it and ``operation`` as it stands now.
    A verified or failed operation settles the task with the version this call
    leased it at: nothing but this call writes a task under its lease, so the
    guarded move either lands or is refused because someone else moved the task
    (a person, the reaper after a lapsed lease); then the task is answered as it
    stands, for the next call with the same key to settle.
    """
    if operation.state in (OperationState.VERIFIED, OperationState.FAILED):
        verified = operation.state == OperationState.VERIFIED
        try:
            return services.task_transition(
                tenant=tenant,
                task_id=task.pk,
                to=TaskState.SUCCEEDED if verified else TaskState.FAILED,
                expected_version=task.state_version,
                lease_token=lease_token,
                actor=actor,
                trace=trace,
                step="action_verified" if verified else "action_failed",
                data={
                    "operation_id": str(operation.pk),
                    "provider_reference": operation.provider_reference,
                },
            )
        except (LeaseExpired, StaleState, IllegalTransition):
            return selectors.task_get(tenant=tenant, task_id=task.pk)
    current = selectors.task_get(tenant=tenant, task_id=task.pk)
    if (
        operation.state in (OperationState.EXECUTING, OperationState.UNKNOWN)
        and current.state == TaskState.RUNNING
        and current.lease_token == lease_token
    ):
        _release(tenant=tenant, task=task, lease_token=lease_token, actor=actor)
        return selectors.task_get(tenant=tenant, task_id=task.pk)
    return current


def _answer(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation,
    created: bool,
    status: Status | None = None,
) -> ActionOutcome:
    """The outcome for the agent, from the operation and task as they stand."""
    if status is None:
        status = _status_of(task, operation)
    desk_item: Escalation | None = None
    reason = operation.reason_code or task.reason_code
    failed_check: str | None = None
    failed_fields: tuple[str, ...] = ()
    details: dict[str, Any] = {}
    if status in ("refused", "human_required"):
        desk_item = (
            Escalation.objects.filter(tenant=tenant, task_id=task.pk)
            .order_by("-created_at")
            .first()
        )
        if desk_item is not None:
            reason = desk_item.reason_code
            problems = [
                item
                for item in desk_item.evidence.get("conflicting_fields", [])
                if isinstance(item, dict) and "field" in item
            ]
            failed_fields = tuple(str(item["field"]) for item in problems)
            if problems:
                details["conflicting_fields"] = problems
            # APPROVAL_REQUIRED: the approval it waits for (id, state, approvals
            # so far, quorum, groups, expiry; docs/approvals.md).
            approval = desk_item.evidence.get("approval")
            if isinstance(approval, dict) and "approval_id" in approval:
                details["approval"] = approval
        failed_check = _refused_check(tenant=tenant, operation=operation, reason=reason)
        if failed_check is not None and status == "human_required":
            status = "refused"
    return ActionOutcome(
        status=status,
        operation_id=operation.pk,
        task_id=task.pk,
        operation_state=operation.state,
        task_state=task.state,
        next_step=_NEXT_STEPS[status],
        status_url=status_url_of(operation.pk),
        created=created,
        reason_code=reason,
        failed_check=failed_check,
        failed_fields=failed_fields,
        provider_reference=operation.provider_reference,
        result=operation.result if isinstance(operation.result, dict) else None,
        desk_item_id=desk_item.pk if desk_item else None,
        attempts=operation.attempts,
        details=details,
    )


def _status_of(task: Task, operation: Operation) -> Status:
    if operation.state == OperationState.RESERVED:
        if task.state in _WITH_A_PERSON:
            return "human_required"
        if task.state in (TaskState.CANCELLED, TaskState.FAILED):
            return "failed"
        return "accepted" if operation.authorized_at is not None else "unknown"
    status = _STATUS_OF_OPERATION[operation.state]
    if status == "human_required" and task.state in (
        TaskState.CANCELLED,
        TaskState.FAILED,
    ):
        return "failed"  # a person ended it
    return status


def _refused_check(
    *, tenant: Tenant, operation: Operation, reason: str | None
) -> str | None:
    """The gateway check that refused the operation for ``reason``, if one did."""
    if reason is None:
        return None
    payload = (
        audit_selectors.event_list(tenant=tenant, task_id=operation.task_id)
        .filter(
            operation_id=operation.pk,
            code=EventCode.GATEWAY_CHECKED,
            reason_code=reason,
        )
        .order_by("-id")
        .values_list("payload", flat=True)
        .first()
    )
    if isinstance(payload, dict) and payload.get("verdict") == "refused":
        check = payload.get("check")
        return str(check) if check else None
    return None


__all__ = [
    "ActionInFlight",
    "ActionOutcome",
    "ActionRequest",
    "FieldRead",
    "Status",
    "action_take",
    "client_task_id_for",
]
