"""Human takeover: escalation, the queue, claim, release, resolve, one-time approvals.

``tasks.escalation.escalate`` hands a task to a person (the gateway calls it when a
check refuses or a result stays in doubt); the services here are what the person does
with it, one of them (``task_human_edit``) through the gateway, which never imports
this module.

A person acts only in tenants where their membership carries ``work_takeover``
(support and admin roles; checked here, in the services, not only by the caller).
Claiming revokes the automatic lease and raises the fencing token, so a worker that
still believes it holds the task can write nothing more. Every step is an event in
the task's own chain and trace, with the person as actor.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.exceptions import IllegalTransition, ValidationFailed
from portal.models import Tenant, TenantPerm
from portal.roles import Person, has_tenant_perm, tenant_ids_with_perm
from portal.tracing import NO_TRACE, Trace

from . import approvals, gateway, keyset, services
from .exceptions import (
    AlreadyClaimed,
    ApprovalRepeatsRefusal,
    NotYourClaim,
    OperationNotFound,
    TaskNotFound,
)
from .gateway import FieldValue, GatewayResult
from .models import (
    Approval,
    ApprovalState,
    Escalation,
    Operation,
    OperationState,
    Task,
    TaskState,
)
from .task_state import TaskStateWrite, task_from_row, task_state_write

if TYPE_CHECKING:
    from collections.abc import Sequence

# A person's claim is a lease like an agent's, only longer: a working day.
HUMAN_LEASE_HOURS: Final = 8

Resolution = Literal[
    "verify", "approve", "retry", "fail", "cancel", "hand_back", "complete"
]
RESOLUTIONS: Final[tuple[str, ...]] = (
    "verify",
    "approve",
    "retry",  # the API's older name for approve
    "fail",
    "cancel",
    "hand_back",
    "complete",
)
# What an escalation records when the person edited the fields and the gateway
# executed and verified with them (task_human_edit): the task moves as on a hand
# back, the record says what the person did.
EDITED_AND_EXECUTED: Final = "edited_and_executed"
_TASK_AFTER: Final[dict[str, str]] = {
    "verify": TaskState.PENDING,
    "approve": TaskState.PENDING,
    "retry": TaskState.PENDING,
    "fail": TaskState.FAILED,
    "cancel": TaskState.CANCELLED,
    "hand_back": TaskState.PENDING,
    "complete": TaskState.SUCCEEDED,
}
_OPEN_OPERATION_STATES: Final = (
    OperationState.HUMAN_REQUIRED,
    OperationState.UNKNOWN,
    OperationState.CONFLICT,
)


# Reasons where running the operation's exact input again, once, is what a person
# may approve: the input was fine and only the way it would run was in doubt. Field,
# version, permission, target and contract refusals would only be refused again.
APPROVABLE_REASONS: Final = frozenset(
    {
        ReasonCode.APPROVAL_REQUIRED,
        ReasonCode.RESULT_UNKNOWN,
        ReasonCode.CREDENTIAL_EXPIRED,
    }
)


def _owner(user: Person) -> str:
    return f"user:{user.pk}"


# --- Escalation ----------------------------------------------------------------------

# --- The queue and a person's moves --------------------------------------------------


def takeover_tenants(*, user: Person) -> QuerySet[Tenant]:
    """Tenants whose takeover queue the user may work (``work_takeover``)."""
    ids = tenant_ids_with_perm(user=user, perm=TenantPerm.WORK_TAKEOVER)
    return Tenant.objects.filter(pk__in=ids)


def _on_task_trace(task: Task, trace: Trace) -> Trace:
    """A person's step joins the task's own trace, so one trace id finds it all."""
    if not task.trace_id:
        return trace
    return Trace(trace_id=task.trace_id, span_id=trace.span_id or Trace.new().span_id)


def takeover_queue(
    *, user: Person, reason: str | None = None, tenant: Tenant | None = None
) -> QuerySet[Task]:
    """Tasks waiting for a person in the user's tenants, oldest first."""
    tasks = Task.objects.filter(
        tenant__in=takeover_tenants(user=user),
        state__in=[TaskState.HUMAN_REQUIRED, TaskState.HUMAN_CLAIMED],
    )
    if tenant is not None:
        tasks = tasks.filter(tenant=tenant)
    if reason is not None:
        tasks = tasks.filter(reason_code=reason)
    return tasks.select_related("tenant").order_by("updated_at", "id")


def takeover_queue_page(
    *,
    user: Person,
    reason: str | None = None,
    tenant: Tenant | None = None,
    newest_first: bool = False,
    after: str | None = None,
    limit: int = keyset.DEFAULT_PAGE_SIZE,
) -> keyset.KeysetPage:
    """A page of the API's takeover queue (``GET /api/v1/takeover/queue``).

    The same rows as ``takeover_queue`` (the user's support and
    admin tenants, human_required and human_claimed), oldest first by default,
    ``newest_first`` for the other end; ``after`` is the ``next`` cursor of the
    previous page. ``items`` carry ``tenant`` (select_related).

    Raises:
        InvalidCursor: ``after`` is not a cursor this portal wrote.
    """
    cursor = keyset.Cursor.decode(after) if after else None
    queue = takeover_queue(user=user, reason=reason, tenant=tenant)
    return keyset.keyset_page(
        queue, newest_first=newest_first, after=cursor, limit=limit
    )


def task_get_for_person(*, user: Person, task_id: uuid.UUID) -> Task:
    """A task in one of the user's takeover tenants.

    Raises:
        TaskNotFound: no such task, or not in a tenant the user may work.
    """
    task = (
        Task.objects.filter(tenant__in=takeover_tenants(user=user), pk=task_id)
        .select_related("tenant")
        .first()
    )
    if task is None:
        raise TaskNotFound(task_id=str(task_id))
    return task


def _require_role(*, tenant: Tenant, user: Person) -> None:
    if not has_tenant_perm(user=user, perm=TenantPerm.WORK_TAKEOVER, tenant=tenant):
        raise TaskNotFound()  # not theirs to work: the task does not exist for them


_CLAIM_MOVES: Final[dict[str, str]] = {
    TaskState.HUMAN_REQUIRED: TaskState.HUMAN_CLAIMED
}
_CLAIM: Final = TaskStateWrite(
    where="t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s",
    assignments=(
        "lease_owner = %(owner)s",
        "lease_token = t.lease_token + 1",
        "lease_acquired_at = app_now()",
        f"lease_expires_at = app_now() + interval '{HUMAN_LEASE_HOURS} hours'",
    ),
)
# Out of a person's hands: the lease goes, with a new fencing token.
_UNCLAIM: Final = TaskStateWrite(
    where=(
        "t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s"
        " AND t.state_version = %(expected_version)s"
    ),
    assignments=(
        "reason_code = CASE WHEN %(keep_reason)s THEN t.reason_code END",
        "lease_owner = NULL",
        "lease_acquired_at = NULL",
        "lease_expires_at = NULL",
        "lease_token = t.lease_token + 1",
    ),
)


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def task_human_claim(*, task: Task, user: Person, trace: Trace = NO_TRACE) -> Task:
    """Take a task from the queue. Exactly one of several claimers wins.

    Guarantee: the automatic lease is gone and the fencing token is larger than any
    a worker holds, in the same transaction as the claim and its event.

    Raises:
        TaskNotFound: not in the user's takeover tenants.
        AlreadyClaimed: someone else claimed it first.
        IllegalTransition: the task is not waiting for a person.
    """
    _require_role(tenant=task.tenant, user=user)
    trace = _on_task_trace(task, trace)
    rows = task_state_write(
        statement=_CLAIM,
        moves=_CLAIM_MOVES,
        params={"owner": _owner(user), "tenant_id": task.tenant_id, "task_id": task.pk},
    )
    if not rows:
        current = Task.objects.get(tenant_id=task.tenant_id, pk=task.pk)
        if current.state == TaskState.HUMAN_CLAIMED:
            raise AlreadyClaimed(task_id=str(task.pk), claimed_by=current.lease_owner)
        raise IllegalTransition(current=current.state, requested="human_claimed")
    claimed = task_from_row(rows[0])
    audit_services.event_append(
        tenant_id=task.tenant_id,
        code=EventCode.TASK_HUMAN_CLAIMED,
        actor=Actor.of_user(user),
        task_id=task.pk,
        reason=claimed.reason_code,
        trace=trace,
        data=payloads.TaskHumanClaimed(
            {
                "lease_token": claimed.lease_token,
                "from": "human_required",
                "to": "human_claimed",
            }
        ),
    )
    return claimed


def _lock_claimed(*, task: Task, requested: str) -> Task:
    current = Task.objects.select_for_update(of=("self",)).get(
        tenant_id=task.tenant_id, pk=task.pk
    )
    if current.state != TaskState.HUMAN_CLAIMED:
        raise IllegalTransition(current=current.state, requested=requested)
    return current


def _require_claimer(*, task: Task, user: Person) -> Task:
    current = _lock_claimed(task=task, requested="resolve")
    if current.lease_owner != _owner(user):
        raise NotYourClaim(task_id=str(task.pk), claimed_by=current.lease_owner)
    return current


def _move_claimed_task(*, task: Task, to: str, keep_reason: bool = False) -> Task:
    (row,) = task_state_write(
        statement=_UNCLAIM,
        moves={TaskState.HUMAN_CLAIMED: to},
        params={
            "keep_reason": keep_reason,
            "tenant_id": task.tenant_id,
            "task_id": task.pk,
            "expected_version": task.state_version,
        },
    )  # exactly one: the row is locked by _lock_claimed
    return task_from_row(row)


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def task_human_release(
    *, task: Task, user: Person, note: str = "", trace: Trace = NO_TRACE
) -> Task:
    """Put a claimed task back in the queue for someone else.

    The claimer releases their own claim; a person whose membership carries
    ``release_any_claim`` (a tenant admin) may release anyone's, e.g. a stale claim
    of someone who went home. The event names both.

    Raises:
        TaskNotFound, IllegalTransition, NotYourClaim.
    """
    _require_role(tenant=task.tenant, user=user)
    trace = _on_task_trace(task, trace)
    current = _lock_claimed(task=task, requested="human_required")
    released_for = None
    if current.lease_owner != _owner(user):
        if not has_tenant_perm(
            user=user, perm=TenantPerm.RELEASE_ANY_CLAIM, tenant=task.tenant
        ):
            raise NotYourClaim(task_id=str(task.pk), claimed_by=current.lease_owner)
        released_for = current.lease_owner
    released = _move_claimed_task(
        task=current, to=TaskState.HUMAN_REQUIRED, keep_reason=True
    )
    audit_services.event_append(
        tenant_id=task.tenant_id,
        code=EventCode.TASK_HUMAN_RELEASED,
        actor=Actor.of_user(user),
        task_id=task.pk,
        reason=released.reason_code,
        trace=trace,
        data=payloads.TaskHumanReleased(
            {
                "from": "human_claimed",
                "to": "human_required",
                "released_for": released_for,
                "note": note,
            }
        ),
    )
    return released


@dataclass(frozen=True, kw_only=True)
class ResolutionOutcome:
    task: Task
    operation: Operation | None


def task_human_resolve(
    *,
    task: Task,
    user: Person,
    resolution: Resolution | str,
    operation_id: uuid.UUID | None = None,
    provider_reference: str | None = None,
    note: str = "",
    trace: Trace = NO_TRACE,
) -> ResolutionOutcome:
    """Settle a claimed task; its outcome joins the same event chain.

    - ``verify``: the person found the receipt: the operation becomes ``verified``
      with ``provider_reference``; the task goes back to automation (``pending``).
    - ``approve`` (``retry``): the person approves running the operation's exact
      input again under the *same* key, where the reason allows it
      (``APPROVABLE_REASONS``); the task goes back to automation, whose next
      execute uses the approval once.
    - ``fail`` / ``cancel``: open operations fail; the task fails / is cancelled.
    - ``hand_back``: back to automation with the note, for a fresh read: the
      agent's next execute under the same key passes every check again with the
      values it reads then. ``complete``: the task succeeded.
    (``task_human_edit`` is the fourth way: the person gives fresh values.)

    Raises:
        TaskNotFound, IllegalTransition, NotYourClaim: see the claim.
        ValidationFailed: unknown resolution, or its operation details are missing.
        OperationNotFound: the operation is not this task's.
        ApprovalRepeatsRefusal: approving the same input would repeat a refusal.
    """
    return _resolve(
        task=task,
        user=user,
        resolution=resolution,
        recorded=resolution,
        operation_id=operation_id,
        provider_reference=provider_reference,
        note=note,
        trace=trace,
    )


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def _resolve(
    *,
    task: Task,
    user: Person,
    resolution: Resolution | str,
    recorded: str,
    operation_id: uuid.UUID | None,
    provider_reference: str | None,
    note: str,
    trace: Trace,
) -> ResolutionOutcome:
    """``task_human_resolve``; the escalation and the ``task.resolved`` event record
    ``recorded``, what the person did (``resolution``, or ``EDITED_AND_EXECUTED``
    for an edit, which moves the task as a hand back)."""
    if resolution not in RESOLUTIONS:
        raise ValidationFailed(field="resolution", value=str(resolution))
    _require_role(tenant=task.tenant, user=user)
    trace = _on_task_trace(task, trace)
    current = _require_claimer(task=task, user=user)
    actor = Actor.of_user(user)
    operation: Operation | None = None
    if operation_id is not None:
        operation = (
            Operation.objects.select_for_update(of=("self",))
            .filter(tenant_id=task.tenant_id, task_id=task.pk, pk=operation_id)
            .first()
        )
        if operation is None:
            raise OperationNotFound(operation_id=str(operation_id))
    elif resolution in ("verify", "approve", "retry"):
        raise ValidationFailed(
            f"'{resolution}' needs operation_id.", field="operation_id"
        )
    if resolution == "verify":
        assert operation is not None
        if not provider_reference:
            raise ValidationFailed(
                "'verify' needs the receipt id the person found.",
                field="provider_reference",
            )
        operation = services.operation_move(
            tenant=task.tenant,
            operation_id=operation.pk,
            to=OperationState.VERIFIED,
            expected_version=operation.state_version,
            actor=actor,
            trace=trace,
            provider_reference=provider_reference,
            data={"note": note},
        )
    elif resolution in ("approve", "retry"):
        assert operation is not None
        if operation.state != OperationState.HUMAN_REQUIRED:
            raise IllegalTransition(current=operation.state, requested=resolution)
        if current.reason_code not in APPROVABLE_REASONS:
            raise ApprovalRepeatsRefusal(reason_code=current.reason_code)
        _approve(operation=operation, user=user, trace=trace)
    elif resolution in ("fail", "cancel"):
        open_operations = Operation.objects.select_for_update(of=("self",)).filter(
            tenant_id=task.tenant_id, task_id=task.pk, state__in=_OPEN_OPERATION_STATES
        )
        for open_operation in open_operations.order_by("pk"):
            moved = services.operation_move(
                tenant=task.tenant,
                operation_id=open_operation.pk,
                to=OperationState.FAILED,
                expected_version=open_operation.state_version,
                actor=actor,
                trace=trace,
                data={"note": note},
            )
            if operation is not None and moved.pk == operation.pk:
                operation = moved
    resolved = _move_claimed_task(task=current, to=_TASK_AFTER[resolution])
    Escalation.objects.filter(
        tenant_id=task.tenant_id, task_id=task.pk, resolved_at__isnull=True
    ).update(resolved_at=Now(), resolved_by_id=user.pk, resolution=recorded)
    audit_services.event_append(
        tenant_id=task.tenant_id,
        code=EventCode.TASK_RESOLVED,
        actor=actor,
        task_id=task.pk,
        operation_id=operation.pk if operation else None,
        reason=current.reason_code,
        trace=trace,
        data=payloads.TaskResolved(
            {
                "resolution": recorded,
                "from": "human_claimed",
                "to": resolved.state,
                "provider_reference": provider_reference,
                "note": note,
            }
        ),
    )
    return ResolutionOutcome(task=resolved, operation=operation)


@dataclass(frozen=True, kw_only=True)
class EditOutcome:
    result: GatewayResult
    task: Task


def task_human_edit(
    *,
    task: Task,
    user: Person,
    operation_id: uuid.UUID,
    fields: Sequence[FieldValue],
    note: str = "",
    trace: Trace = NO_TRACE,
) -> EditOutcome:
    """The person gives fresh field values; the gateway executes with them.

    The person states each value with its source and when they read it; the gateway
    runs every check again (contract, fields, target, permission, version) and calls
    the remote system under the operation's own idempotency key, with the person as
    actor, so at most one side effect exists whoever executes. On ``verified`` the
    task goes back to automation (as on ``hand_back``, recorded on the escalation
    and the ``task.resolved`` event as ``edited_and_executed``) to finish its
    workflow; otherwise the person keeps the claim, and a refusal leaves a new
    escalation with its evidence.

    Raises:
        TaskNotFound, IllegalTransition, NotYourClaim: see the claim.
        OperationNotFound: the operation is not this task's.
        ValidationFailed: no field values.
        TransactionForbidden: called inside a transaction (the gateway calls out).
    """
    portal_db.forbid_transaction("the gateway calls the remote system")
    if not fields:
        raise ValidationFailed("Give the fresh value of each field.", field="fields")
    claimed = _edit_record(
        task=task,
        user=user,
        operation_id=operation_id,
        fields=fields,
        note=note,
        trace=trace,
    )
    result = gateway.operation_execute(
        tenant=task.tenant,
        operation_id=operation_id,
        lease_token=claimed.lease_token,
        fields=fields,
        actor=Actor.of_user(user),
        trace=_on_task_trace(task, trace),
    )
    if result.outcome == "verified":
        resolved = _resolve(
            task=task,
            user=user,
            resolution="hand_back",
            recorded=EDITED_AND_EXECUTED,
            operation_id=operation_id,
            provider_reference=None,
            note=note or "executed with values a person gave; verified",
            trace=trace,
        )
        return EditOutcome(result=result, task=resolved.task)
    current = Task.objects.get(tenant_id=task.tenant_id, pk=task.pk)
    return EditOutcome(result=result, task=current)


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def _edit_record(
    *,
    task: Task,
    user: Person,
    operation_id: uuid.UUID,
    fields: Sequence[FieldValue],
    note: str,
    trace: Trace,
) -> Task:
    """Check the claim and the operation; record what the person supplied.

    The values themselves stay out of the trail (they are often personal data);
    their names, sources and read times go in.
    """
    _require_role(tenant=task.tenant, user=user)
    current = _require_claimer(task=task, user=user)
    operation = (
        Operation.objects.select_for_update(of=("self",))
        .filter(tenant_id=task.tenant_id, task_id=task.pk, pk=operation_id)
        .first()
    )
    if operation is None:
        raise OperationNotFound(operation_id=str(operation_id))
    if operation.state not in (OperationState.HUMAN_REQUIRED, OperationState.RESERVED):
        raise IllegalTransition(current=operation.state, requested="edit")
    audit_services.event_append(
        tenant_id=task.tenant_id,
        code=EventCode.OPERATION_FIELDS_EDITED,
        actor=Actor.of_user(user),
        task_id=task.pk,
        operation_id=operation.pk,
        reason=current.reason_code,
        trace=_on_task_trace(task, trace),
        data=payloads.OperationFieldsEdited(
            {
                "fields": [
                    {
                        "name": field.name,
                        "source": field.source,
                        "observed_at": field.observed_at.isoformat(),
                    }
                    for field in fields
                ],
                "note": note,
            }
        ),
    )
    return current


def _approve(*, operation: Operation, user: Person, trace: Trace) -> None:
    """The person's approval at the desk (tasks/approvals.py: its quorum and groups
    hold), and the ``operation.approved`` event of the resolution."""
    approvals.approval_desk_decide(operation=operation, user=user, trace=trace)
    current = (
        Approval.objects.filter(tenant_id=operation.tenant_id, operation=operation)
        .order_by("-requested_at", "-id")
        .first()
    )
    assert current is not None
    audit_services.event_append(
        tenant_id=operation.tenant_id,
        code=EventCode.OPERATION_APPROVED,
        actor=Actor.of_user(user),
        task_id=operation.task_id,
        operation_id=operation.pk,
        trace=trace,
        data=payloads.OperationApproved(
            {
                "approval_id": str(current.pk),
                "approval_state": current.state,
                "input_hash": current.input_hash,
                "idempotency_key": operation.idempotency_key,
            }
        ),
    )


def approval_decide(
    *,
    approval_id: uuid.UUID,
    user: Person,
    verdict: str,
    reason: str = "",
    trace: Trace = NO_TRACE,
) -> Approval:
    """``approvals.approval_decide``; once that makes it approved, the task waiting
    for it at the desk (unclaimed, ``APPROVAL_REQUIRED``) goes back to automation:
    claimed and handed back by this approver when they work the desk, so the
    agent's next execute under the same key uses the approval. Otherwise the task
    stays at the desk for a person to hand back (or ``approve``).

    Raises: see ``approvals.approval_decide``.
    """
    approval = approvals.approval_decide(
        approval_id=approval_id, user=user, verdict=verdict, reason=reason, trace=trace
    )
    if approval.state != ApprovalState.APPROVED:
        return approval
    task = Task.objects.get(
        tenant_id=approval.tenant_id,
        pk=Operation.objects.filter(
            tenant_id=approval.tenant_id, pk=approval.operation_id
        ).values("task_id")[:1],
    )
    if (
        task.state != TaskState.HUMAN_REQUIRED
        or task.reason_code != ReasonCode.APPROVAL_REQUIRED
        or not has_tenant_perm(
            user=user, perm=TenantPerm.WORK_TAKEOVER, tenant=task.tenant
        )
    ):
        return approval
    try:
        claimed = task_human_claim(task=task, user=user, trace=trace)
    except IllegalTransition:
        return approval  # someone at the desk took it meanwhile: theirs to settle
    task_human_resolve(
        task=claimed,
        user=user,
        resolution="hand_back",
        note=f"approved by {approval.quorum} of {approval.quorum}",
        trace=trace,
    )
    return approval
