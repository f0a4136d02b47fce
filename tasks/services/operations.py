"""Writes of operations: reserve, move, begin execution, record an outcome."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from django.db import connection, transaction

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from audit.redaction import redact, refuse_sensitive
from limits import services as limits_services
from policies import engine as policy_engine
from policies import selectors as policy_selectors
from policies.exceptions import PolicyDenied, PolicyError
from policies.models import PolicySetState
from portal import db as portal_db
from portal import selectors as portal_selectors
from portal.actors import Actor, ActorType
from portal.codes import ReasonCode
from portal.exceptions import (
    IdempotencyKeyReused,
    IllegalTransition,
    LeaseExpired,
    StaleState,
    ValidationFailed,
)
from portal.ids import new_id
from portal.models import Tenant
from portal.tracing import NO_TRACE, Trace

from .. import selectors
from ..contracts import (
    contract_amount_fields,
    contract_risk_class,
    contract_sensitive_fields,
)
from ..exceptions import (
    ActionNotGranted,
    GatewayGoverned,
    OperationNotFound,
)
from ..hashing import input_hash
from ..models import (
    OPERATION_TRANSITIONS,
    Connector,
    Operation,
    OperationState,
    Task,
)
from ..sealed import SETTLED_STATES, seal
from ._common import _fetch, _task_refusal

OPERATION_ATTNAMES, OPERATION_COLUMNS = portal_db.returning_columns(Operation, "o")
"""Every concrete column of ``tasks_operation`` (alias ``o``), in
``operation_from_row`` order."""

# Legal source states for each target state: the guard travels inside the UPDATE.
_OPERATION_SOURCES: Final[dict[str, list[str]]] = {
    target: sorted(source for source, to in OPERATION_TRANSITIONS if to == target)
    for target in OperationState.values
}


def operation_sensitive_fields(
    *, tenant_id: uuid.UUID, operation_id: uuid.UUID
) -> dict[str, str]:
    """The sensitive fields the pinned contract of the operation's task declares
    (none unpinned), in one statement."""
    row = _fetch(
        """
        SELECT c.spec FROM tasks_operation AS o
        JOIN tasks_task AS t ON t.tenant_id = o.tenant_id AND t.id = o.task_id
        JOIN tasks_contract AS c ON c.tenant_id = t.tenant_id
            AND c.key = t.contract_key AND c.version = t.contract_version
        WHERE o.tenant_id = %s AND o.id = %s
        """,
        [tenant_id, operation_id],
    )
    return contract_sensitive_fields(row[0]) if row else {}


def operation_from_row(row: Sequence[Any]) -> Operation:
    """An ``Operation`` from a raw row that returns ``OPERATION_COLUMNS`` (no query)."""
    return portal_db.model_from_row(Operation, OPERATION_ATTNAMES, row)


# --- Operations ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Reservation:
    operation: Operation
    created: bool


# The lease is read FOR SHARE: a takeover (an UPDATE of the task) waits for this
# transaction, so the token checked here is still current at commit.
_LIVE_LEASE = """
    SELECT tenant_id, id FROM tasks_task
    WHERE tenant_id = %(tenant_id)s AND id = %(task_id)s
      AND lease_token = %(lease_token)s
      AND lease_owner IS NOT NULL AND lease_expires_at > app_now()
    FOR SHARE
"""

_RESERVE = f"""
WITH lease AS ({_LIVE_LEASE})
INSERT INTO tasks_operation AS o (
    id, tenant_id, task_id, idempotency_key, action, target, input_hash, input,
    sealed, agent_id, state, state_version, attempts, lookups, trace_id, span_id
)
SELECT %(id)s, lease.tenant_id, lease.id, %(key)s, %(action)s, %(target)s,
       %(input_hash)s, %(input)s::jsonb, %(sealed)s, %(agent_id)s, 'reserved', 1,
       0, 0, %(trace_id)s, %(span_id)s
FROM lease
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING {OPERATION_COLUMNS}
"""


# What a reservation reads before it writes, in one round trip: the task's pinned
# contract spec (its sensitive fields redact the stored input; None when unpinned)
# and whether the tenant has a policy set in force (only then is it loaded and
# evaluated, after the insert). For an agent also its grant
# (``portal.selectors.agent_may``'s condition) and its admission
# (``limits.services.admission_statement``: the freeze flags, share-locked before
# the task is, and its limits for the action and target); no row: no such agent.
_RESERVE_READS = """
    (SELECT c.spec FROM tasks_task AS t
     JOIN tasks_contract AS c ON c.tenant_id = t.tenant_id
         AND c.key = t.contract_key AND c.version = t.contract_version
     WHERE t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s),
    EXISTS (SELECT FROM policies_policyset AS p
            WHERE p.tenant_id = %(tenant_id)s AND p.state = %(published)s)"""
_RESERVE_CONTEXT = f"SELECT true,{_RESERVE_READS}"
_RESERVE_CONTEXT_OF_AGENT = limits_services.admission_statement(
    f"{portal_selectors.AGENT_MAY_EXISTS},{_RESERVE_READS}"
)


@limits_services.refusals_recorded("reserve")
@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def operation_reserve(
    *,
    tenant: Tenant,
    task_id: uuid.UUID,
    lease_token: int,
    idempotency_key: str,
    action: str,
    target: str,
    input: Any,
    actor: Actor,
    trace: Trace = NO_TRACE,
) -> Reservation:
    """Reserve a side effect under a stable idempotency key, before any call is made.

    Idempotent: the same key with the same input (by RFC 8785 hash) returns the stored
    operation (``created=False``), whoever asks and whether or not the lease is still
    held. Only a new reservation needs the task's live lease.

    An agent needs a grant for the action and target (checked first, every time).
    Then, for a new reservation, the tenant's policy set in force (if any) must not
    deny it (docs/policies.md); its decision joins the ``operation.reserved`` event.
    An ``@approval`` does not stop a reservation: the execution waits for a person.

    Raises:
        ActionNotGranted: the acting agent holds no grant for action and target.
        IdempotencyKeyReused: the key is taken by a different input; nothing changed.
        TaskNotFound: no such task in the tenant.
        LeaseExpired: the token is not current or the lease lapsed.
        InputNotCanonicalisable: the input has no RFC 8785 form.
        SensitiveValue: the key, action or target carries a secret or personal data.
        PolicyDenied, PolicyError: the policy set in force refuses a new
            reservation, or cannot be evaluated; nothing was written.
        AgentFrozen, TenantFrozen, RateLimited, BudgetExceeded: a new reservation
            of a frozen agent or tenant, or over one of the agent's limits
            (docs/limits.md); nothing was written, the denial is an event.

    The input is stored redacted (the pinned contract's ``sensitive_fields`` as
    keyed hashes, detected secrets and personal data cut out); the real input is
    sealed for the call (tasks/sealed.py). ``input_hash`` is over the real input.
    """
    refuse_sensitive(idempotency_key=idempotency_key, action=action, target=target)
    trace = trace.or_current()  # NO_TRACE: the current span's (portal/tracing.py)
    agent_id = uuid.UUID(actor.id) if actor.type == ActorType.AGENT else None
    with connection.cursor() as cursor:
        cursor.execute(
            _RESERVE_CONTEXT if agent_id is None else _RESERVE_CONTEXT_OF_AGENT,
            {
                "tenant_id": tenant.pk,
                "task_id": task_id,
                "agent_id": agent_id,
                "action": action,
                "target": target,
                "published": PolicySetState.PUBLISHED,
            },
        )
        context = cursor.fetchall()  # an agent's: one row per limit
    granted, spec, policy_set_published = (
        context[0][:3] if context else (False, None, False)
    )
    if isinstance(spec, str | bytes):  # jsonb arrives as text on Django's connection
        spec = json.loads(spec)
    if not granted:  # no grant, or no such agent in the tenant
        raise ActionNotGranted(action=action, target=target)
    digest = input_hash(input)
    operation_id = new_id()
    stored_input = redact(
        input,
        tenant_id=tenant.pk,
        sensitive=contract_sensitive_fields(spec) if spec is not None else {},
    )
    row = _fetch(
        _RESERVE,
        {
            "tenant_id": tenant.pk,
            "task_id": task_id,
            "lease_token": lease_token,
            "id": operation_id,
            "key": idempotency_key,
            "action": action,
            "target": target,
            "input_hash": digest,
            "input": audit_services.json_text(stored_input),
            "sealed": seal(
                tenant_id=tenant.pk, operation_id=operation_id, values={"input": input}
            ),
            "agent_id": actor.id if actor.type == ActorType.AGENT else None,
            "trace_id": trace.trace_id,
            "span_id": trace.span_id,
        },
    )
    if row is None:
        existing = selectors.operation_get_by_key(
            tenant=tenant, idempotency_key=idempotency_key
        )
        if existing is None:
            raise _task_refusal(
                tenant_id=tenant.pk, task_id=task_id, lease_token=lease_token
            )
        if existing.input_hash != digest:
            raise IdempotencyKeyReused(idempotency_key=idempotency_key)
        return Reservation(operation=existing, created=False)
    operation = operation_from_row(row)
    # After the insert, so a replay above is answered as stored; a refusal here
    # rolls the new row back.
    policy = (
        _reserve_policy(tenant=tenant, operation=operation, actor=actor, spec=spec)
        if policy_set_published
        else None
    )
    # Charged for a new reservation only: a replay above spends nothing.
    charges = (
        limits_services.reservation_admit(
            tenant=tenant,
            agent_id=actor.id,
            admission=limits_services.Admission.of(context),
            input=input,
        )
        if agent_id is not None
        else []
    )
    reserved = payloads.OperationReserved(
        {
            "idempotency_key": idempotency_key,
            "action": action,
            "target": target,
            "input_hash": digest,
            "lease_token": lease_token,
        }
    )
    if policy:
        reserved["policy"] = policy.as_evidence()
    if charges:
        reserved["limits"] = charges
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.OPERATION_RESERVED,
        actor=actor,
        task_id=task_id,
        operation_id=operation.pk,
        trace=trace,
        data=reserved,
    )
    return Reservation(operation=operation, created=True)


def _reserve_policy(
    *, tenant: Tenant, operation: Operation, actor: Actor, spec: Any
) -> policy_engine.Decision | None:
    """The policy set's decision on an agent's new reservation (None: no set in
    force, or not an agent). ``spec``: the task's pinned contract's, or None.

    Raises:
        PolicyDenied, PolicyError: the set denies, or cannot be evaluated.
    """
    if actor.type != ActorType.AGENT:
        return None
    policy_set = policy_selectors.policy_set_in_force(tenant=tenant)
    if policy_set is None:
        return None
    task = Task.objects.get(tenant=tenant, pk=operation.task_id)
    decision = policy_engine.evaluate(
        policy_set=policy_set,
        request=policy_engine.request_for(
            tenant=tenant,
            agent_id=actor.id,
            action=operation.action,
            target=operation.target,
            object_type=task.object_type,
            object_id=task.object_id,
            object_version=task.object_version,
            arguments=operation.input,
            contract_key=task.contract_key,
            contract_version=task.contract_version,
            amount_fields=contract_amount_fields(spec),
            risk_class=contract_risk_class(spec),
            phase="reserve",
            at=operation.created_at,
        ),
    )
    if decision.verdict == policy_engine.Verdict.DENY:
        raise PolicyDenied(policy=decision.as_evidence())
    if decision.verdict == policy_engine.Verdict.ERROR:
        raise PolicyError(policy=decision.as_evidence())
    return decision


_OPERATION_SET = """
    state = %(to)s::varchar,
    state_version = o.state_version + 1,
    attempts = o.attempts + %(attempt)s,
    lookups = o.lookups + %(lookup)s,
    reason_code = %(reason)s,
    provider_reference = COALESCE(%(provider_reference)s, o.provider_reference),
    result = COALESCE(%(result)s::jsonb, o.result),
    -- Settled: no call can follow, so the real values go (tasks/sealed.py).
    sealed = CASE WHEN %(to)s::varchar = ANY(%(settled)s::varchar[])
        THEN NULL ELSE o.sealed END,
    next_check_at = app_now() + %(check_in)s,
    updated_at = statement_timestamp()
"""

# Under the task's lease (an agent). The lease is read FOR SHARE, as in _RESERVE.
_OPERATION_MOVE_UNDER_LEASE = f"""
WITH lease AS (
    SELECT t.id FROM tasks_task AS t
    WHERE t.tenant_id = %(tenant_id)s
      AND t.id = (SELECT task_id FROM tasks_operation
                  WHERE tenant_id = %(tenant_id)s AND id = %(operation_id)s)
      AND t.lease_token = %(lease_token)s
      AND t.lease_owner IS NOT NULL AND t.lease_expires_at > app_now()
    FOR SHARE
)
UPDATE tasks_operation AS o SET {_OPERATION_SET}
FROM tasks_operation AS old, lease
WHERE o.tenant_id = %(tenant_id)s AND o.id = %(operation_id)s AND old.id = o.id
  AND o.task_id = lease.id
  AND o.state = ANY(%(sources)s)
  -- An agent's own report: only on a target the gateway does not govern.
  AND NOT (%(self_reported)s AND EXISTS (
      SELECT FROM tasks_connector AS c
      WHERE c.tenant_id = o.tenant_id AND c.target = o.target))
RETURNING old.state, {OPERATION_COLUMNS}
"""

# By the portal itself (recovery) or a person: guarded by the version they read.
_OPERATION_MOVE_AT_VERSION = f"""
UPDATE tasks_operation AS o SET {_OPERATION_SET}
FROM tasks_operation AS old
WHERE o.tenant_id = %(tenant_id)s AND o.id = %(operation_id)s AND old.id = o.id
  AND o.state_version = %(expected_version)s
  AND o.state = ANY(%(sources)s)
RETURNING old.state, {OPERATION_COLUMNS}
"""

_OUTCOME_EVENTS: Final = {
    OperationState.EXECUTING: EventCode.OPERATION_EXECUTING,
    OperationState.VERIFIED: EventCode.OPERATION_VERIFIED,
    OperationState.FAILED: EventCode.OPERATION_FAILED,
    OperationState.UNKNOWN: EventCode.OPERATION_UNKNOWN,
    OperationState.CONFLICT: EventCode.OPERATION_CONFLICTED,
    OperationState.HUMAN_REQUIRED: EventCode.OPERATION_ESCALATED,
}


def operation_move(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    to: OperationState,
    actor: Actor,
    trace: Trace = NO_TRACE,
    lease_token: int | None = None,
    expected_version: int | None = None,
    reason: str | None = None,
    provider_reference: str | None = None,
    result: Mapping[str, Any] | None = None,
    check_in: dt.timedelta | None = None,
    lookup: bool = False,
    data: payloads.OperationExtra | None = None,
    sources: tuple[str, ...] | None = None,
    self_reported: bool = False,
) -> Operation:
    """Move an operation and append its event, in the caller's transaction.

    Guarded either by the task's live lease (``lease_token``, agents) or by the
    operation's ``state_version`` (``expected_version``, the portal and people).
    ``check_in`` schedules the next recovery look (None: no look is due).
    ``sources`` narrows the states the move may start from (never widens them
    beyond ``OPERATION_TRANSITIONS``). ``self_reported`` (an agent's own start or
    outcome, under its lease) adds the guard that no connector governs the target,
    in the same statement.

    Raises:
        TransactionRequired: called outside a transaction.
        OperationNotFound, LeaseExpired, StaleState, IllegalTransition: the guard
            failed; nothing changed.
        GatewayGoverned: ``self_reported`` on a target with a connector.
    """
    portal_db.require_transaction()
    if (lease_token is None) == (expected_version is None):
        raise TypeError("pass exactly one of lease_token and expected_version")
    if self_reported and lease_token is None:
        raise TypeError("a self-reported move is under the task's lease")
    if result is not None:
        sensitive = operation_sensitive_fields(
            tenant_id=tenant.pk, operation_id=operation_id
        )
        redacted = redact(dict(result), tenant_id=tenant.pk, sensitive=sensitive)
    else:
        redacted = None
    if provider_reference is not None:
        # The remote's (or a person's) receipt id: kept readable unless a detector
        # finds a secret or personal data in it.
        provider_reference = str(redact(provider_reference, tenant_id=tenant.pk))
    row = _fetch(
        _OPERATION_MOVE_UNDER_LEASE
        if lease_token is not None
        else _OPERATION_MOVE_AT_VERSION,
        {
            "tenant_id": tenant.pk,
            "operation_id": operation_id,
            "lease_token": lease_token,
            "expected_version": expected_version,
            "self_reported": self_reported,
            "to": to,
            "reason": reason,
            "attempt": int(to == OperationState.EXECUTING),
            "lookup": int(lookup),
            "provider_reference": provider_reference,
            "result": audit_services.json_text(redacted) if redacted else None,
            "settled": list(SETTLED_STATES),
            "check_in": check_in,
            "sources": [
                source
                for source in _OPERATION_SOURCES[to]
                if sources is None or source in sources
            ],
        },
    )
    if row is None:
        if self_reported:
            _require_self_reported(tenant=tenant, operation_id=operation_id)
        raise _operation_refusal(
            tenant=tenant,
            operation_id=operation_id,
            lease_token=lease_token,
            expected_version=expected_version,
            to=to,
        )
    previous_state, operation = row[0], operation_from_row(row[1:])
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=_OUTCOME_EVENTS[to],
        actor=actor,
        task_id=operation.task_id,
        operation_id=operation.pk,
        reason=reason,
        trace=trace,
        data=payloads.OperationMoved(
            {
                "from": previous_state,
                "to": to,
                "attempts": operation.attempts,
                "idempotency_key": operation.idempotency_key,
                "provider_reference": provider_reference,
                "lease_token": lease_token,
                **(data or {}),
            }
        ),
    )
    return operation


def _operation_refusal(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    lease_token: int | None,
    expected_version: int | None,
    to: str,
) -> Exception:
    row = _fetch(
        """
        SELECT o.state, o.state_version, t.lease_token,
               t.lease_owner IS NOT NULL AND t.lease_expires_at > app_now()
        FROM tasks_operation AS o
        JOIN tasks_task AS t ON t.tenant_id = o.tenant_id AND t.id = o.task_id
        WHERE o.tenant_id = %s AND o.id = %s
        """,
        [tenant.pk, operation_id],
    )
    if row is None:
        return OperationNotFound(operation_id=str(operation_id))
    state, state_version, current_token, lease_live = row
    if lease_token is not None and (current_token != lease_token or not lease_live):
        return LeaseExpired(operation_id=str(operation_id), lease_token=lease_token)
    if expected_version is not None and state_version != expected_version:
        return StaleState(
            operation_id=str(operation_id),
            expected_state_version=expected_version,
            state_version=state_version,
        )
    return IllegalTransition(
        operation_id=str(operation_id), current=state, requested=str(to)
    )


# What an agent may move itself, on a target without a connector: start a reserved
# operation or retry one in doubt, report the outcome of its own call, or give up on
# one it never started. Never out of ``human_required`` or ``conflict``: those are
# a person's.
_SELF_REPORTED_SOURCES: Final[dict[str, tuple[str, ...]]] = {
    OperationState.EXECUTING: (OperationState.RESERVED, OperationState.UNKNOWN),
    OperationState.VERIFIED: (OperationState.EXECUTING, OperationState.UNKNOWN),
    OperationState.FAILED: (
        OperationState.RESERVED,
        OperationState.EXECUTING,
        OperationState.UNKNOWN,
    ),
    OperationState.UNKNOWN: (OperationState.EXECUTING,),
}


def _require_self_reported(*, tenant: Tenant, operation_id: uuid.UUID) -> None:
    """Refuse an agent's own report on an operation the gateway governs.

    A target with a connector is executed only through the gateway, which checks
    contract, fields, grant, version and credential and proves the receipt; a
    self-reported start or outcome there would skip all of it.
    """
    target = (
        Operation.objects.filter(tenant=tenant, pk=operation_id)
        .values_list("target", flat=True)
        .first()
    )
    if target is None:
        raise OperationNotFound(operation_id=str(operation_id))
    if Connector.objects.filter(tenant=tenant, target=target).exists():
        raise GatewayGoverned(operation_id=str(operation_id), target=target)


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def operation_begin_execution(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    lease_token: int,
    actor: Actor,
    trace: Trace = NO_TRACE,
) -> Operation:
    """Mark an operation ``executing`` (one more attempt) just before the remote call.

    For an operation the agent executes itself, on a target with no connector; the
    gateway alone starts and records what goes to a connector's target. Starts from
    ``reserved`` or ``unknown`` (a retry under the same key), never from
    ``human_required``: that is a person's to release. Commit this before calling
    out; the call itself runs with no transaction open.

    Raises:
        OperationNotFound: no such operation in the tenant.
        GatewayGoverned: the target has a connector; nothing changed.
        LeaseExpired: the task's lease token is not current or lapsed.
        IllegalTransition: the operation cannot start from its state.
    """
    return operation_move(
        tenant=tenant,
        operation_id=operation_id,
        lease_token=lease_token,
        to=OperationState.EXECUTING,
        actor=actor,
        trace=trace,
        sources=_SELF_REPORTED_SOURCES[OperationState.EXECUTING],
        self_reported=True,
    )


OUTCOMES: Final = (
    OperationState.VERIFIED,
    OperationState.FAILED,
    OperationState.UNKNOWN,
)


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def operation_record_outcome(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    lease_token: int,
    outcome: OperationState | str,
    actor: Actor,
    provider_reference: str | None = None,
    result: Mapping[str, Any] | None = None,
    reason: ReasonCode | str | None = None,
    trace: Trace = NO_TRACE,
) -> Operation:
    """Record what the agent's own call did: ``verified``, ``failed`` or ``unknown``.

    Only on a target with no connector (the gateway records the rest). ``verified``
    needs the provider's receipt id. ``unknown`` defaults its reason to
    ``RESULT_UNKNOWN``. The result is stored redacted.

    Raises:
        ValidationFailed: not an outcome, or ``verified`` without a receipt id.
        SensitiveValue: the receipt id carries a secret or personal data.
        OperationNotFound: no such operation in the tenant.
        GatewayGoverned: the target has a connector; nothing changed.
        LeaseExpired: the task's lease token is not current or lapsed.
        IllegalTransition: the operation is not executing (or unknown).
    """
    if outcome not in OUTCOMES:
        raise ValidationFailed(field="outcome", value=str(outcome))
    state = OperationState(outcome)
    if state == OperationState.VERIFIED and not provider_reference:
        raise ValidationFailed(
            "A verified outcome needs the provider's receipt id.",
            field="provider_reference",
        )
    if state == OperationState.UNKNOWN and reason is None:
        reason = ReasonCode.RESULT_UNKNOWN
    refuse_sensitive(provider_reference=provider_reference)
    return operation_move(
        tenant=tenant,
        operation_id=operation_id,
        lease_token=lease_token,
        to=state,
        actor=actor,
        trace=trace,
        reason=reason,
        provider_reference=provider_reference,
        result=result,
        sources=_SELF_REPORTED_SOURCES[state],
        self_reported=True,
    )
