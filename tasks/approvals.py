"""Approvals: bound to the exact arguments and field values, decided by a quorum of
distinct people, used once (issue 21 §2, docs/approvals.md).

The gateway asks (``approval_for_execution``) when a policy's ``@approval`` or a
connector that cannot settle doubt needs people first; the approvers decide
(``approval_decide``: the staff API and the desk's approvals page); the next
execution of the same operation with the same input (``input_hash``) and the same
field values (``field_digest``) uses it up (``approval_consume``). An approval whose
window passed is recorded as ``expired``, never as a rejection. The database holds
the same rules (tasks migration 0021): the moves, the quorum before ``approved``,
one decision per person, decisions never rewritten, the sponsor kept out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, QuerySet

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal import scope
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.db import db_now
from portal.exceptions import ValidationFailed
from portal.models import Agent, Tenant, TenantPerm
from portal.roles import Person, has_tenant_perm, tenant_ids_with_perm
from portal.tracing import NO_TRACE, Trace
from routing import services as routing_services
from routing.models import GroupMember, ItemKind

from .exceptions import ApprovalExpired, ApprovalNotAllowed, ApprovalNotFound
from .hashing import canonical_json, input_hash
from .models import (
    Approval,
    ApprovalDecision,
    ApprovalState,
    ApprovalVerdict,
    Operation,
)

# The validity window when the policy names none (``@approval_ttl_s``).
DEFAULT_TTL_S: Final = 86_400
_OPEN: Final = (ApprovalState.WAITING, ApprovalState.APPROVED)
EXPIRY: Final = Actor.system("approvals")


class CheckedField(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def value(self) -> Any: ...


def field_digest(fields: Iterable[CheckedField]) -> str:
    """SHA-256 of the RFC 8785 list of (name, source, SHA-256 of the value's RFC 8785
    form), sorted by name: the field values the gateway checked, without the values."""
    return input_hash(
        sorted(
            [
                field.name,
                field.source,
                hashlib.sha256(canonical_json(field.value)).hexdigest(),
            ]
            for field in fields
        )
    )


def ttl_s() -> int:
    return int(getattr(settings, "PORTAL_APPROVAL_TTL_S", DEFAULT_TTL_S))


def _facts(approval: Approval) -> payloads.ApprovalFacts:
    return {
        "approval_id": str(approval.pk),
        "state": approval.state,
        "input_hash": approval.input_hash,
        "field_digest": approval.field_digest,
        "quorum": approval.quorum,
        "groups": list(approval.groups),
    }


def _event(
    approval: Approval,
    code: str,
    *,
    actor: Actor,
    trace: Trace,
    data: payloads.Payload,
    operation: Operation | None = None,
) -> None:
    task_id = (
        operation.task_id
        if operation is not None
        else Operation.objects.values_list("task_id", flat=True).get(
            tenant_id=approval.tenant_id, pk=approval.operation_id
        )
    )
    audit_services.event_append(
        tenant_id=approval.tenant_id,
        code=code,
        actor=actor,
        task_id=task_id,
        operation_id=approval.operation_id,
        trace=trace,
        data=data,
    )


def _expire_due(
    *, tenant_id: uuid.UUID, now: dt.datetime, operation_id: uuid.UUID | None = None
) -> list[Approval]:
    """Mark open approvals past their window ``expired`` (an event each)."""
    portal_db.require_transaction()
    due = Approval.objects.select_for_update(of=("self",)).filter(
        tenant_id=tenant_id, state__in=_OPEN, expires_at__lte=now
    )
    if operation_id is not None:
        due = due.filter(operation_id=operation_id)
    expired = []
    for approval in due.order_by("pk"):
        was = approval.state
        approval.state = ApprovalState.EXPIRED
        approval.decided_at = now
        approval.save(update_fields=["state", "decided_at"])
        _event(
            approval,
            EventCode.APPROVAL_EXPIRED,
            actor=EXPIRY,
            trace=NO_TRACE,
            data=payloads.ApprovalExpired(
                {
                    **_facts(approval),
                    "was": was,
                    "expires_at": approval.expires_at.isoformat()
                    if approval.expires_at
                    else None,
                }
            ),
        )
        expired.append(approval)
    return expired


@transaction.atomic
def approvals_expire(*, tenant: Tenant) -> int:
    """Record the tenant's approvals past their window as expired (read time and the
    approvals page call it; the gateway checks the window itself)."""
    return len(_expire_due(tenant_id=tenant.pk, now=db_now()))


@scope.in_tenants_with("routing_tenants_with_due_work")
@transaction.atomic(durable=True)
def approvals_expire_overdue() -> int:
    """Record every open approval past its window as expired, across the tenants
    that have one (the SLA sweep's job calls it, so an approval nobody reads does
    not stay waiting). One ``approval.expired`` each, never a rejection; measured
    on ``app_now()``. Idempotent: an expired approval is not open any more."""
    now = db_now()
    tenant_ids = (
        Approval.objects.filter(state__in=_OPEN, expires_at__lte=now)
        .values_list("tenant_id", flat=True)
        .distinct()
    )
    return sum(
        len(_expire_due(tenant_id=tenant_id, now=now))
        for tenant_id in sorted(tenant_ids)  # one lock order across tenants
    )


def _evidence(approval: Approval) -> dict[str, Any]:
    approvals = approval.decisions.filter(verdict=ApprovalVerdict.APPROVE).count()
    return {
        "approval_id": str(approval.pk),
        "state": approval.state,
        "approvals": approvals,
        "quorum": approval.quorum,
        "groups": list(approval.groups),
        "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
    }


@dataclass(frozen=True, kw_only=True)
class Wanted:
    """Whether an approved approval of this input and these fields is there to use,
    and what the person should know when it is not."""

    usable: bool
    evidence: Mapping[str, Any]


def approval_for_execution(
    *,
    tenant: Tenant,
    operation: Operation,
    digest: str,
    requested: Mapping[str, Any],
    asked: Mapping[str, Any],
    now: dt.datetime,
    actor: Actor,
    trace: Trace,
) -> Wanted:
    """Find the operation's approval of this input and these field values, or ask.

    In the gateway checks' transaction. An open approval bound to other field
    values is superseded and a new one asked; one whose window passed is expired
    first. ``requested`` is what the policy asked (groups, quorum, ``ttl_s``,
    ``separate_from_sponsor``); ``asked`` is what the approvers will see.
    """
    portal_db.require_transaction()
    _expire_due(tenant_id=tenant.pk, now=now, operation_id=operation.pk)
    current = (
        Approval.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, operation=operation, state__in=_OPEN)
        .first()
    )
    why = "no approval of these arguments and field values yet"
    if current is not None:
        if current.input_hash == operation.input_hash and current.field_digest in (
            "",
            digest,
        ):
            if current.state == ApprovalState.APPROVED:
                return Wanted(usable=True, evidence=_evidence(current))
            return Wanted(
                usable=False,
                evidence={
                    "approval": _evidence(current),
                    "why": "waiting for approvers",
                },
            )
        superseded = current.state
        current.state = ApprovalState.SUPERSEDED
        current.decided_at = now
        current.save(update_fields=["state", "decided_at"])
        _event(
            current,
            EventCode.APPROVAL_SUPERSEDED,
            actor=actor,
            trace=trace,
            operation=operation,
            data=payloads.ApprovalSuperseded(
                {**_facts(current), "was": superseded, "seen_field_digest": digest}
            ),
        )
        why = "the approval was for other field values"
    groups = sorted(str(group) for group in requested.get("groups", []))
    approval = Approval.objects.create(
        tenant=tenant,
        operation=operation,
        input_hash=operation.input_hash,
        field_digest=digest,
        groups=groups,
        quorum=max(1, int(requested.get("quorum") or 1)),
        sponsor_excluded=bool(requested.get("separate_from_sponsor")),
        asked=dict(asked),
        state=ApprovalState.WAITING,
        requested_at=now,
        expires_at=now + dt.timedelta(seconds=int(requested.get("ttl_s") or ttl_s())),
    )
    _event(
        approval,
        EventCode.APPROVAL_REQUESTED,
        actor=actor,
        trace=trace,
        operation=operation,
        data=payloads.ApprovalRequested(
            {
                **_facts(approval),
                "sponsor_excluded": approval.sponsor_excluded,
                "expires_at": approval.expires_at.isoformat()
                if approval.expires_at
                else None,
                "asked": approval.asked,
            }
        ),
    )
    # The approvers' group is told and the SLA clock runs (docs/routing.md); the
    # notification carries ids and codes, never what is asked.
    routing_services.item_assign(
        tenant=tenant,
        item_kind=ItemKind.APPROVAL,
        item_id=approval.pk,
        reason_code=ReasonCode.APPROVAL_REQUIRED,
        task_id=operation.task_id,
        actor=actor,
        group_names=approval.groups,
    )
    return Wanted(usable=False, evidence={"approval": _evidence(approval), "why": why})


def approval_consume(
    *,
    tenant: Tenant,
    operation: Operation,
    digest: str,
    now: dt.datetime,
    actor: Actor,
    trace: Trace,
) -> Approval | None:
    """Use the operation's approved approval of this input and these fields, once.

    One conditional UPDATE: of two executions racing for it, one gets it.
    """
    portal_db.require_transaction()
    used = (
        Approval.objects.filter(
            tenant=tenant,
            operation=operation,
            state=ApprovalState.APPROVED,
            input_hash=operation.input_hash,
        )
        .filter(Q(field_digest="") | Q(field_digest=digest))
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .update(state=ApprovalState.CONSUMED, used_at=now)
    )
    if not used:
        return None
    approval = Approval.objects.get(
        tenant=tenant, operation=operation, state=ApprovalState.CONSUMED, used_at=now
    )
    _event(
        approval,
        EventCode.APPROVAL_CONSUMED,
        actor=actor,
        trace=trace,
        operation=operation,
        data=payloads.ApprovalConsumed(
            {**_facts(approval), "idempotency_key": operation.idempotency_key}
        ),
    )
    return approval


def _sponsor_id(approval: Approval) -> int | None:
    return (
        Agent.objects.filter(
            tenant_id=approval.tenant_id,
            pk=Operation.objects.filter(
                tenant_id=approval.tenant_id, pk=approval.operation_id
            ).values("agent_id")[:1],
        )
        .values_list("sponsor_id", flat=True)
        .first()
    )


def may_decide(*, approval: Approval, user: Person) -> str | None:
    """Why ``user`` may not decide ``approval`` (None: they may)."""
    tenant = Tenant.objects.get(pk=approval.tenant_id)
    if user.pk is None:
        return "sign in first"
    if approval.state != ApprovalState.WAITING:
        return f"the approval is {approval.state} already"
    if approval.groups:
        if not GroupMember.objects.filter(
            tenant_id=approval.tenant_id,
            group__name__in=approval.groups,
            user_id=int(user.pk),
        ).exists():
            return "you are not in " + " or ".join(approval.groups)
    elif not has_tenant_perm(user=user, perm=TenantPerm.WORK_TAKEOVER, tenant=tenant):
        return "you do not work the desk in this tenant"
    if approval.sponsor_excluded and _sponsor_id(approval) == user.pk:
        return "you sponsor the agent that asked; someone else must approve"
    if approval.decisions.filter(person_id=user.pk).exists():
        return "you decided this approval already; the others must be other people"
    return None


def _decide(
    *,
    approval: Approval,
    user: Person,
    verdict: str,
    reason: str,
    now: dt.datetime,
    trace: Trace,
) -> Approval:
    """Record one person's decision on a locked, waiting approval, and its outcome."""
    portal_db.require_transaction()
    if verdict not in ApprovalVerdict.values:
        raise ValidationFailed(field="verdict", value=verdict)
    if verdict == ApprovalVerdict.REJECT and not reason.strip():
        raise ValidationFailed("A rejection needs a reason.", field="reason")
    if approval.state == ApprovalState.EXPIRED:
        raise ApprovalExpired(approval_id=str(approval.pk))
    refused = may_decide(approval=approval, user=user)
    if refused is not None:
        raise ApprovalNotAllowed(refused, approval_id=str(approval.pk))
    saw = {
        "approval_id": str(approval.pk),
        "asked": approval.asked,
        "input_hash": approval.input_hash,
        "field_digest": approval.field_digest,
        "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
    }
    saw_digest = input_hash(saw)
    assert user.pk is not None  # may_decide refused anyone else
    ApprovalDecision.objects.create(
        tenant_id=approval.tenant_id,
        approval=approval,
        person_id=user.pk,
        verdict=verdict,
        reason=reason,
        decided_at=now,
        saw=saw,
        saw_digest=saw_digest,
    )
    actor = Actor.of_user(user)
    _event(
        approval,
        EventCode.APPROVAL_DECIDED,
        actor=actor,
        trace=trace,
        data=payloads.ApprovalDecided(
            {
                **_facts(approval),
                "verdict": verdict,
                "reason": reason,
                "saw": saw,
                "saw_digest": saw_digest,
            }
        ),
    )
    approvals = approval.decisions.filter(verdict=ApprovalVerdict.APPROVE).count()
    if verdict == ApprovalVerdict.REJECT:
        approval.state = ApprovalState.REJECTED
        code = EventCode.APPROVAL_REJECTED
    elif approvals >= approval.quorum:
        approval.state = ApprovalState.APPROVED
        code = EventCode.APPROVAL_APPROVED
    else:
        return approval
    approval.decided_at = now
    approval.approved_by_id = user.pk
    approval.save(update_fields=["state", "decided_at", "approved_by"])
    _event(
        approval,
        code,
        actor=actor,
        trace=trace,
        data=payloads.ApprovalOutcome(
            {
                **_facts(approval),
                "approvals": approvals,
                "approvers": sorted(
                    str(person)
                    for person in approval.decisions.filter(
                        verdict=ApprovalVerdict.APPROVE
                    ).values_list("person_id", flat=True)
                ),
                "reason": reason,
            }
        ),
    )
    return approval


def _locked(*, approval_id: uuid.UUID, user: Person) -> Approval:
    approval = (
        Approval.objects.select_for_update(of=("self",))
        .filter(
            pk=approval_id,
            tenant_id__in=tenant_ids_with_perm(user=user, perm=TenantPerm.VIEW_TRAIL),
        )
        .first()
    )
    if approval is None:
        raise ApprovalNotFound(approval_id=str(approval_id))
    return approval


@portal_db.translate_integrity_errors
def approval_decide(
    *,
    approval_id: uuid.UUID,
    user: Person,
    verdict: str,
    reason: str = "",
    trace: Trace = NO_TRACE,
) -> Approval:
    """One approver's decision: ``approve`` (the quorum's last makes it approved) or
    ``reject`` with a reason (ends it).

    Raises:
        ApprovalNotFound: not in a tenant where the person sees tasks.
        ApprovalExpired: its window passed (and that is recorded, as expired).
        ApprovalNotAllowed: not in the group the policy names, the agent's sponsor
            where the policy separates them, decided by this person already, or the
            approval is not waiting.
        ValidationFailed: an unknown verdict, or a rejection without a reason.
    """
    with transaction.atomic(durable=True):
        now = db_now()
        approval = _locked(approval_id=approval_id, user=user)
        expired = _expire_due(
            tenant_id=approval.tenant_id, now=now, operation_id=approval.operation_id
        )
    if any(item.pk == approval.pk for item in expired):
        raise ApprovalExpired(approval_id=str(approval_id))
    with transaction.atomic(durable=True):
        approval = _locked(approval_id=approval_id, user=user)
        return _decide(
            approval=approval,
            user=user,
            verdict=verdict,
            reason=reason,
            now=db_now(),
            trace=trace,
        )


def approval_desk_decide(*, operation: Operation, user: Person, trace: Trace) -> None:
    """The desk's ``approve`` resolution: the person's approval of the operation's
    open approval (quorum and groups hold), or, when none was asked (a retry after
    ``RESULT_UNKNOWN``), a one-person approval of its input. In the caller's
    transaction."""
    portal_db.require_transaction()
    now = db_now()
    _expire_due(tenant_id=operation.tenant_id, now=now, operation_id=operation.pk)
    current = (
        Approval.objects.select_for_update(of=("self",))
        .filter(tenant_id=operation.tenant_id, operation=operation, state__in=_OPEN)
        .first()
    )
    if current is not None and current.state == ApprovalState.WAITING:
        _decide(
            approval=current,
            user=user,
            verdict=ApprovalVerdict.APPROVE,
            reason="",
            now=now,
            trace=trace,
        )
        return
    if current is not None:
        return  # approved already: the next execution uses it
    approval = Approval.objects.create(
        tenant_id=operation.tenant_id,
        operation=operation,
        input_hash=operation.input_hash,
        state=ApprovalState.APPROVED,
        approved_by_id=user.pk,
        requested_at=now,
        decided_at=now,
        expires_at=now + dt.timedelta(seconds=ttl_s()),
    )
    _event(
        approval,
        EventCode.APPROVAL_APPROVED,
        actor=Actor.of_user(user),
        trace=trace,
        operation=operation,
        data=payloads.ApprovalApproved(
            {
                **_facts(approval),
                "approvals": 1,
                "approvers": [str(user.pk)],
                "reason": "",
            }
        ),
    )


def approvals_waiting_for(*, user: Person) -> QuerySet[Approval]:
    """The waiting approvals in the person's tenants, oldest first, with the count
    of approvals so far (``approvals``); ``may_decide`` says which they may decide."""
    return (
        Approval.objects.filter(
            state=ApprovalState.WAITING,
            tenant_id__in=tenant_ids_with_perm(user=user, perm=TenantPerm.VIEW_TRAIL),
        )
        .select_related("tenant", "operation")
        .annotate(approvals=Count("decisions", filter=Q(decisions__verdict="approve")))
        .order_by("requested_at", "id")
    )
