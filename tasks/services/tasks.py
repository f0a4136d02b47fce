"""Writes of tasks: registration, transitions, leases, the claim of the next task,
and the housekeeping Celery beat runs (lease reaper, wake-up).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from audit.redaction import redact, refuse_sensitive
from limits import services as limits_services
from portal import db as portal_db
from portal import metrics, scope
from portal.actors import Actor, ActorType
from portal.codes import ReasonCode
from portal.exceptions import (
    ValidationFailed,
)
from portal.ids import new_id
from portal.models import Tenant
from portal.tracing import NO_TRACE, Trace

from .. import selectors
from ..exceptions import (
    ContractNotFound,
    ContractRetired,
    LeaseHeld,
    TaskIdReused,
    TaskNotLeasable,
)
from ..hashing import input_hash
from ..models import (
    ContractStatus,
    Operation,
    OperationState,
    Task,
    TaskState,
)
from ..task_state import (
    TASK_COLUMNS,
    TASK_STATES,
    TaskStateWrite,
    task_from_row,
    task_moves_to,
    task_state_write,
)
from ._common import _fetch, _task_refusal

LEASABLE_STATES: Final = (TaskState.PENDING, TaskState.RUNNING, TaskState.WAITING)


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


# --- Registration --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Registration:
    task: Task
    created: bool


_INSERT_TASK = f"""
INSERT INTO tasks_task AS t (
    id, tenant_id, client_task_id, registration_hash, workflow_key, workflow_version,
    contract_key, contract_version, object_type, object_id, object_version,
    state, state_version, current_step, lease_token, trace_id, span_id
) VALUES (
    %(id)s, %(tenant_id)s, %(client_task_id)s, %(registration_hash)s, %(workflow_key)s,
    %(workflow_version)s, %(contract_key)s, %(contract_version)s, %(object_type)s,
    %(object_id)s, %(object_version)s, 'pending', 1, '', 0, %(trace_id)s, %(span_id)s
)
ON CONFLICT (tenant_id, client_task_id) DO NOTHING
RETURNING {TASK_COLUMNS}
"""


@limits_services.refusals_recorded("register")
@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def task_register(
    *,
    tenant: Tenant,
    actor: Actor,
    client_task_id: str,
    workflow_key: str,
    workflow_version: str,
    object_type: str,
    object_id: str,
    object_version: str,
    contract_key: str | None = None,
    contract_version: int | None = None,
    claim_owner: str | None = None,
    claim_ttl_s: float | None = None,
    trace: Trace = NO_TRACE,
) -> Registration:
    """Register a task, pinning its workflow, contract and object versions.

    Idempotent on ``client_task_id``: the same details return the stored task
    (``created=False``). A contract key without a version pins the newest published
    version.

    With ``claim_owner``, a newly registered task is also claimed by that owner in
    the same transaction, as ``task_claim_next`` would (``running`` under a new
    lease of ``claim_ttl_s``; events ``task.registered`` then ``task.claimed``),
    saving the worker a second transaction. A task registered before is returned
    as stored, unclaimed: claim or lease it as usual.

    Raises:
        TaskIdReused: the id was registered with different details.
        ContractNotFound: no such published contract version.
        ContractRetired: the pinned version is retired.
        SensitiveValue: an identifier carries a secret or personal data.
        AgentFrozen, TenantFrozen: the acting agent or its tenant is frozen.
    """
    if actor.type == ActorType.AGENT:
        limits_services.agent_admit(tenant=tenant, agent_id=actor.id)
    claim_ttl = _lease_ttl(claim_ttl_s) if claim_owner is not None else None
    refuse_sensitive(
        owner=claim_owner,
        client_task_id=client_task_id,
        workflow_key=workflow_key,
        workflow_version=workflow_version,
        object_type=object_type,
        object_id=object_id,
        object_version=object_version,
    )
    if contract_key is not None:
        if contract_version is None:
            contract = selectors.contract_latest_published(
                tenant=tenant, key=contract_key
            )
        else:
            contract = selectors.contract_get(
                tenant=tenant, key=contract_key, version=contract_version
            )
        if contract.status == ContractStatus.RETIRED:
            raise ContractRetired(key=contract_key, version=contract.version)
        if contract.status != ContractStatus.PUBLISHED:
            raise ContractNotFound(key=contract_key, version=contract.version)
        contract_version = contract.version
        pinned: tuple[str, int] | None = (contract_key, contract.version)
    else:
        pinned = None
    details = {
        "client_task_id": client_task_id,
        "workflow_key": workflow_key,
        "workflow_version": workflow_version,
        "contract_key": contract_key,
        "contract_version": contract_version,
        "object_type": object_type,
        "object_id": object_id,
        "object_version": object_version,
    }
    registration_hash = input_hash(details)
    row = _fetch(
        _INSERT_TASK,
        {
            **details,
            "id": new_id(),
            "tenant_id": tenant.pk,
            "registration_hash": registration_hash,
            # NO_TRACE: the current span's (portal/tracing.py).
            "trace_id": trace.or_current().trace_id,
            "span_id": trace.or_current().span_id,
        },
    )
    if row is None:  # registered before (or concurrently, now committed)
        existing = Task.objects.get(tenant=tenant, client_task_id=client_task_id)
        if existing.registration_hash != registration_hash:
            raise TaskIdReused(client_task_id=client_task_id)
        return Registration(task=existing, created=False)
    task = task_from_row(row)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TASK_REGISTERED,
        actor=actor,
        task_id=task.pk,
        trace=trace,
        contract=pinned,
        data=payloads.TaskRegistered(
            {
                "client_task_id": client_task_id,
                "workflow": {"key": workflow_key, "version": workflow_version},
                "object": {
                    "type": object_type,
                    "id": object_id,
                    "version": object_version,
                },
            }
        ),
    )
    if claim_owner is not None:
        rows = task_state_write(
            statement=_CLAIM_REGISTERED,
            moves=_CLAIM_NEXT_MOVES,
            params={
                "tenant_id": tenant.pk,
                "task_id": task.pk,
                "owner": claim_owner,
                "ttl": claim_ttl,
            },
        )
        task = task_from_row(rows[0])  # made above, in this transaction
        _claimed_event(
            tenant=tenant, task=task, owner=claim_owner, actor=actor, trace=trace
        )
    return Registration(task=task, created=True)


# --- Transitions ---------------------------------------------------------------------

_TRANSITION: Final = TaskStateWrite(
    where="""t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s
  AND t.state_version = %(expected_version)s
  AND t.lease_token = %(lease_token)s
  AND t.lease_owner IS NOT NULL AND t.lease_expires_at > app_now()""",
    assignments=(
        "reason_code = %(reason)s",
        "current_step = COALESCE(%(step)s, t.current_step)",
        "wake_at = %(wake_at)s",
        "lease_owner = CASE WHEN %(keep_lease)s THEN t.lease_owner END",
        "lease_acquired_at = CASE WHEN %(keep_lease)s THEN t.lease_acquired_at END",
        "lease_expires_at = CASE WHEN %(keep_lease)s THEN t.lease_expires_at END",
    ),
    returning_old=("state",),
)


# The transition, its event, the chain link and the outbox row in one statement
# (issue 23: one round trip per state change). The event's payload names the state
# the task moved from and its current step, which only the row knows: they are the
# payload's slots (audit/services.py, ``slotted_event_sql``), filled in by the
# statement from the written row. Everything else is redacted and canonicalised here.
# ``_blank_step_only`` (the one-round-trip write without a step) also asks that the
# task has no current step, so that redaction is known to keep the payload as it is.
_TRANSITION_IN_ONE: Final = dataclasses.replace(
    _TRANSITION,
    where=f"({_TRANSITION.where})"
    " AND (NOT %(_blank_step_only)s OR t.current_step = '')",
)
# Whitespace folded: psycopg converts a statement's placeholders once and caches the
# result only for statements up to ``MAX_CACHED_STATEMENT_LENGTH`` (4096) characters;
# a longer one is parsed again on every call (about 0.4 ms of client CPU here).
_TRANSITION_SLOTS: Final = ("from", "step")
_TRANSITION_AND_EVENT: Final = " ".join(
    (
        f"WITH {audit_services.SLOTTED_GENERIC},"
        f" moved_task AS ({_TRANSITION_IN_ONE.sql}), "
        + audit_services.slotted_event_sql(
            source="moved_task",
            slots=(
                "to_jsonb(moved_task.old_state)::text",
                "COALESCE(to_jsonb(moved_task.current_step)::text, 'null')",
            ),
        )
        + " SELECT (SELECT count(*) FROM outbox), moved_task.* FROM moved_task"
    ).split()
)
_PAYLOAD_MAX_BYTES: Final = settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES // 2


class _WriteTwoStatements(Exception):
    """The one-statement transition wrote what ``event_append`` would not have:
    roll it back and write the transition in two statements instead."""


def _redaction_keeps(key: str, value: str) -> bool:
    """Whether redaction leaves ``value`` as it is under ``key`` in a small payload."""
    return redact({key: value}, tenant_id=uuid.UUID(int=0)) == {key: value}


@functools.cache
def _redaction_keeps_sources(to: str) -> bool:
    """Whether redaction keeps the name of each state a task may move to ``to`` from."""
    return all(_redaction_keeps("from", source) for source in task_moves_to(to))


def task_transition(
    *,
    tenant: Tenant,
    task_id: uuid.UUID,
    to: TaskState | str,
    expected_version: int,
    lease_token: int,
    actor: Actor,
    reason: ReasonCode | str | None = None,
    step: str | None = None,
    wake_at: dt.datetime | None = None,
    data: Mapping[str, Any] | None = None,
    trace: Trace = NO_TRACE,
) -> Task:
    """Move a task to ``to`` under its lease; state, event and outbox row commit as one.

    The lease stays with the task only while it is ``running``; any other target state
    hands the lease back (the fencing token is kept, so old holders stay fenced out).

    One statement writes the task, its event, the chain link and the outbox row
    (``_TRANSITION_AND_EVENT``); the event is the one ``event_append`` writes, byte for
    byte. Without data, and with a step redaction keeps (or none, on a task without
    one), the statement is its own transaction, sent with the tenant scope in one
    round trip (``scope.one_round_trip``). Otherwise it runs in a transaction that
    checks, after the write, that redaction keeps the payload; where it does not,
    the transaction is rolled back and the transition written again as the state
    write and ``event_append``.

    Raises:
        TaskNotFound: no such task in the tenant.
        LeaseExpired: the token is not the current one, or the lease lapsed.
        StaleState: ``expected_version`` is not the current state version.
        IllegalTransition: the state machine does not allow the move.
    """
    if to not in TASK_STATES:
        raise ValidationFailed(field="to", value=str(to))
    refuse_sensitive(step=step)
    if wake_at is not None and to != TaskState.WAITING:
        raise ValidationFailed(
            "wake_at is only for moves to 'waiting'.", field="wake_at"
        )
    to = str(TaskState(to).value)
    write = functools.partial(
        _task_transition_write,
        tenant=tenant,
        task_id=task_id,
        to=to,
        expected_version=expected_version,
        lease_token=lease_token,
        actor=actor,
        reason=reason,
        step=step,
        wake_at=wake_at,
        data=data or {},
        trace=trace,
    )
    if (
        not data
        and not connection.in_atomic_block
        and _redaction_keeps_sources(to)
        and (step is None or _redaction_keeps("step", step))
    ):
        task = write(one_statement=True, round_trip=True)
        if task is not None:
            return task  # else a guard held, or the task has a step: say or write
    try:
        task = write(one_statement=True, round_trip=False)
    except _WriteTwoStatements:
        task = write(one_statement=False, round_trip=False)
    assert task is not None
    return task


@portal_db.translate_integrity_errors
def _task_transition_write(*, round_trip: bool, **kwargs: Any) -> Task | None:
    """``task_transition``'s write: in one round trip (None when nothing was
    written), else in a transaction of its own."""
    if round_trip:
        return _task_transition_rows(**kwargs, round_trip=True)
    with transaction.atomic(durable=True):
        return _task_transition_rows(**kwargs, round_trip=False)


def _task_transition_rows(
    *,
    tenant: Tenant,
    task_id: uuid.UUID,
    to: str,
    expected_version: int,
    lease_token: int,
    actor: Actor,
    reason: ReasonCode | str | None,
    step: str | None,
    wake_at: dt.datetime | None,
    data: Mapping[str, Any],
    trace: Trace,
    one_statement: bool,
    round_trip: bool,
) -> Task | None:
    """The write in one statement (in one round trip, or in the caller's
    transaction), or in two (state, then ``event_append``)."""
    params = {
        "reason": reason,
        "step": step,
        "wake_at": wake_at,
        "keep_lease": to == TaskState.RUNNING,
        "tenant_id": tenant.pk,
        "task_id": task_id,
        "expected_version": expected_version,
        "lease_token": lease_token,
    }
    known: dict[str, Any] = {}
    event = None
    if one_statement:
        fields: payloads.TaskTransitioned = {
            "to": to,
            "state_version": expected_version + 1,
            "lease_token": lease_token,
            "data": data,
        }
        known = redact(
            fields,
            tenant_id=tenant.pk,
            max_bytes=_PAYLOAD_MAX_BYTES,
        )
        event = audit_services.slotted_event_params(
            tenant_id=tenant.pk,
            code=EventCode.TASK_TRANSITIONED,
            actor=actor,
            task_id=task_id,
            payload=known,
            slots=_TRANSITION_SLOTS,
            reason=reason,
            trace=trace,
        )
    if event is None and round_trip:
        return None  # a payload the one statement does not write: in a transaction
    if event is None:
        rows = task_state_write(
            statement=_TRANSITION, moves=task_moves_to(to), params=params
        )
    else:
        bound = {
            **_TRANSITION_IN_ONE.params(moves=task_moves_to(to), params=params),
            "_blank_step_only": round_trip and step is None,
            **event,
        }
        try:
            if round_trip:
                rows = scope.one_round_trip(_TRANSITION_AND_EVENT, bound)
            else:
                with connection.cursor() as cursor:
                    cursor.execute(_TRANSITION_AND_EVENT, bound)
                    rows = cursor.fetchall()
        except IntegrityError as error:
            # A concurrent first append made the chain's head row first.
            if portal_db.constraint_name(error) != audit_services.CHAIN_HEAD_UNIQUE:
                raise
            if round_trip:
                return None
            raise _WriteTwoStatements from error
    if not rows:
        if round_trip:
            return None
        raise _task_refusal(
            tenant_id=tenant.pk,
            task_id=task_id,
            lease_token=lease_token,
            expected_version=expected_version,
            to=to,
        )
    (row,) = rows
    if event is not None:
        written, row = row[0], row[1:]
    previous_state, task = row[0], task_from_row(row[1:])
    payload: payloads.TaskTransitioned = {
        "from": previous_state,
        "to": to,
        "state_version": task.state_version,
        "step": task.current_step,
        "lease_token": lease_token,
        "data": data,
    }
    if event is None:
        audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.TASK_TRANSITIONED,
            actor=actor,
            task_id=task.pk,
            reason=reason,
            trace=trace,
            data=payload,
        )
        return task
    if not round_trip and (
        not written
        or task.state_version != expected_version + 1
        or redact(payload, tenant_id=tenant.pk, max_bytes=_PAYLOAD_MAX_BYTES)
        != {**known, "from": previous_state, "step": task.current_step}
    ):
        raise _WriteTwoStatements
    # In one round trip the checks were made before the write: no data, a step
    # redaction keeps or a blank one, the sources' names, and the state version
    # (the statement moves the state, so it rises by one, from expected_version).
    audit_services.slotted_event_written()
    return task


# --- Leases --------------------------------------------------------------------------

_LEASE_ACQUIRE = f"""
UPDATE tasks_task AS t SET
    lease_owner = %(owner)s,
    lease_token = t.lease_token + 1,
    lease_acquired_at = app_now(),
    lease_expires_at = app_now() + %(ttl)s,
    updated_at = statement_timestamp()
FROM tasks_task AS old
WHERE t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s AND old.id = t.id
  AND t.state = ANY(%(leasable)s)
  AND (t.lease_owner IS NULL OR t.lease_expires_at <= app_now())
RETURNING old.lease_owner, {TASK_COLUMNS}
"""


def _lease_ttl(ttl_s: float | None) -> dt.timedelta:
    seconds = settings.PORTAL_DEFAULT_LEASE_SECONDS if ttl_s is None else ttl_s
    if not 0 < seconds <= settings.PORTAL_MAX_LEASE_SECONDS:
        raise ValidationFailed(
            f"ttl_s must be in (0, {settings.PORTAL_MAX_LEASE_SECONDS}].",
            field="ttl_s",
            value=seconds,
        )
    return _seconds(seconds)


@limits_services.refusals_recorded("lease")
@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def task_lease_acquire(
    *,
    tenant: Tenant,
    task_id: uuid.UUID,
    owner: str,
    actor: Actor,
    ttl_s: float | None = None,
    trace: Trace = NO_TRACE,
) -> Task:
    """Take the lease of a pending, running or waiting task that nobody holds.

    Guarantee: the new fencing token is larger than any token issued for this task
    before, so writes under an older token are refused from now on.

    Raises:
        TaskNotFound: no such task in the tenant.
        TaskNotLeasable: the task is not pending, running or waiting.
        LeaseHeld: someone else holds an unexpired lease.
        SensitiveValue: the owner name carries a secret or personal data.
        AgentFrozen, TenantFrozen: the acting agent or its tenant is frozen.
    """
    refuse_sensitive(owner=owner)
    ttl = _lease_ttl(ttl_s)
    if actor.type == ActorType.AGENT:
        limits_services.agent_admit(tenant=tenant, agent_id=actor.id)
    row = _fetch(
        _LEASE_ACQUIRE,
        {
            "owner": owner,
            "ttl": ttl,
            "tenant_id": tenant.pk,
            "task_id": task_id,
            "leasable": list(LEASABLE_STATES),
        },
    )
    if row is None:
        task = selectors.task_get(tenant=tenant, task_id=task_id)
        if task.state not in LEASABLE_STATES:
            raise TaskNotLeasable(task_id=str(task_id), state=task.state)
        raise LeaseHeld(task_id=str(task_id))
    previous_owner, task = row[0], task_from_row(row[1:])
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TASK_LEASE_ACQUIRED,
        actor=actor,
        task_id=task.pk,
        trace=trace,
        data=payloads.TaskLeaseAcquired(
            {
                "owner": owner,
                "lease_token": task.lease_token,
                "expires_at": task.lease_expires_at,
                "taken_over_from": previous_owner,
            }
        ),
    )
    return task


_LEASE_RENEW = f"""
UPDATE tasks_task AS t SET lease_expires_at = app_now() + %(ttl)s
WHERE t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s
  AND t.lease_token = %(lease_token)s
  AND t.lease_owner IS NOT NULL AND t.lease_expires_at > app_now()
RETURNING {TASK_COLUMNS}
"""


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def task_lease_renew(
    *, tenant: Tenant, task_id: uuid.UUID, lease_token: int, ttl_s: float | None = None
) -> Task:
    """Extend a live lease from now by ``ttl_s``.

    A heartbeat changes no state, so it writes no event: the expiry on the task row is
    the record. A lapsed lease cannot be renewed; acquire it again (new token).

    Raises:
        TaskNotFound: no such task in the tenant.
        LeaseExpired: the token is not current or the lease already lapsed.
    """
    row = _fetch(
        _LEASE_RENEW,
        {
            "ttl": _lease_ttl(ttl_s),
            "tenant_id": tenant.pk,
            "task_id": task_id,
            "lease_token": lease_token,
        },
    )
    if row is None:
        raise _task_refusal(
            tenant_id=tenant.pk, task_id=task_id, lease_token=lease_token
        )
    return task_from_row(row)


_LEASE_CLEARED: Final = (
    "lease_owner = NULL",
    "lease_acquired_at = NULL",
    "lease_expires_at = NULL",
)
# A running task goes back to pending; in any other state only the lease goes.
_LEASE_RELEASE_MOVES: Final[dict[str, str]] = {TaskState.RUNNING: TaskState.PENDING}
_LEASE_RELEASE: Final = TaskStateWrite(
    where="""t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s
  AND t.lease_token = %(lease_token)s
  AND t.lease_owner IS NOT NULL AND t.lease_expires_at > app_now()""",
    assignments=_LEASE_CLEARED,
    stay=frozenset(TaskState.values) - set(_LEASE_RELEASE_MOVES),
    returning_old=("state", "lease_owner"),
)


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def task_lease_release(
    *,
    tenant: Tenant,
    task_id: uuid.UUID,
    lease_token: int,
    actor: Actor,
    trace: Trace = NO_TRACE,
) -> Task:
    """Give the lease back. A running task returns to ``pending`` for another worker.

    Raises:
        TaskNotFound: no such task in the tenant.
        LeaseExpired: the token is not current or the lease already lapsed.
    """
    rows = task_state_write(
        statement=_LEASE_RELEASE,
        moves=_LEASE_RELEASE_MOVES,
        params={"tenant_id": tenant.pk, "task_id": task_id, "lease_token": lease_token},
    )
    if not rows:
        raise _task_refusal(
            tenant_id=tenant.pk, task_id=task_id, lease_token=lease_token
        )
    (row,) = rows
    previous_state, previous_owner, task = row[0], row[1], task_from_row(row[2:])
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TASK_LEASE_RELEASED,
        actor=actor,
        task_id=task.pk,
        trace=trace,
        data=payloads.TaskLeaseReleased(
            {
                "owner": previous_owner,
                "lease_token": lease_token,
                "from": previous_state,
                "to": task.state,
            }
        ),
    )
    return task


_CLAIM_NEXT_MOVES: Final[dict[str, str]] = {TaskState.PENDING: TaskState.RUNNING}
_CLAIM_NEXT: Final = TaskStateWrite(
    # ``flags``: the kill switch of an agent's claim, read as ``limits.selectors.
    # frozen_reason`` reads it (FOR SHARE, so a freeze waits for this transaction)
    # but in the same statement; no agent (a person, the portal): no row, no check.
    with_="""WITH flags AS (
    SELECT a.frozen_at IS NOT NULL OR tn.frozen_at IS NOT NULL AS frozen
    FROM portal_agent AS a JOIN portal_tenant AS tn ON tn.id = a.tenant_id
    WHERE a.tenant_id = %(tenant_id)s AND a.id = %(agent_id)s
    FOR SHARE OF a, tn
), next AS (
    SELECT id FROM tasks_task
    WHERE tenant_id = %(tenant_id)s AND state = 'pending'
      AND (lease_owner IS NULL OR lease_expires_at <= app_now())
      AND NOT EXISTS (SELECT FROM flags WHERE frozen)
    ORDER BY created_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)""",
    # A scalar subquery, not a join with ``next``: the row is then found by its
    # primary key whatever the planner estimates for the CTE (a join let it scan
    # every pending task of every tenant, docs/performance-log.md, issue 11).
    where="t.id = (SELECT id FROM next)",
    assignments=(
        "reason_code = NULL",
        "lease_owner = %(owner)s",
        "lease_token = t.lease_token + 1",
        "lease_acquired_at = app_now()",
        "lease_expires_at = app_now() + %(ttl)s",
    ),
)


# The claim of a task ``task_register`` has just made (pending, no lease yet).
_CLAIM_REGISTERED: Final = TaskStateWrite(
    where="t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s",
    assignments=_CLAIM_NEXT.assignments,
)


@limits_services.refusals_recorded("lease")
@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def task_claim_next(
    *,
    tenant: Tenant,
    owner: str,
    actor: Actor,
    ttl_s: float | None = None,
    trace: Trace = NO_TRACE,
) -> Task | None:
    """Claim the oldest pending task: it becomes ``running`` under a new lease.

    Safe on many workers at once: locked candidates are skipped, never waited on, and
    each task is claimed by exactly one caller. Returns None when nothing is pending.

    Raises:
        SensitiveValue: the owner name carries a secret or personal data.
        AgentFrozen, TenantFrozen: the acting agent or its tenant is frozen.
    """
    refuse_sensitive(owner=owner)
    agent_id = uuid.UUID(actor.id) if actor.type == ActorType.AGENT else None
    rows = task_state_write(
        statement=_CLAIM_NEXT,
        moves=_CLAIM_NEXT_MOVES,
        params={
            "tenant_id": tenant.pk,
            "agent_id": agent_id,
            "owner": owner,
            "ttl": _lease_ttl(ttl_s),
        },
    )
    if not rows:
        if agent_id is not None:  # nothing pending, or a frozen agent: say which
            limits_services.agent_admit(tenant=tenant, agent_id=agent_id)
        return None
    task = task_from_row(rows[0])
    _claimed_event(tenant=tenant, task=task, owner=owner, actor=actor, trace=trace)
    return task


def _claimed_event(
    *, tenant: Tenant, task: Task, owner: str, actor: Actor, trace: Trace
) -> None:
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TASK_CLAIMED,
        actor=actor,
        task_id=task.pk,
        trace=trace,
        data=payloads.TaskClaimed(
            {
                "from": TaskState.PENDING,
                "to": TaskState.RUNNING,
                "owner": owner,
                "lease_token": task.lease_token,
                "state_version": task.state_version,
            }
        ),
    )


# --- Housekeeping: lease reaper and wake-up (run by Celery beat) --------------------

# A lapsed lease sends a running task back to pending and a person's claim back to
# the queue; a pending or waiting task only loses the lease.
_REAP_MOVES: Final[dict[str, str]] = {
    TaskState.RUNNING: TaskState.PENDING,
    TaskState.HUMAN_CLAIMED: TaskState.HUMAN_REQUIRED,
}
_REAP: Final = TaskStateWrite(
    with_="""WITH lapsed AS (
    SELECT id FROM tasks_task
    WHERE lease_owner IS NOT NULL AND lease_expires_at <= app_now()
      AND state IN ('pending', 'running', 'waiting', 'human_claimed')
    ORDER BY lease_expires_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)""",
    from_="lapsed",
    where="t.id = lapsed.id",
    assignments=(
        "reason_code = CASE WHEN t.state IN ('running', 'human_claimed') "
        "THEN 'LEASE_EXPIRED' ELSE t.reason_code END",
        *_LEASE_CLEARED,
    ),
    stay=frozenset({TaskState.PENDING, TaskState.WAITING}),
    returning_old=("state", "lease_owner"),
)


@scope.in_tenants_with("tasks_tenants_with_lapsed_leases")
@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def unscoped_leases_reap(*, limit: int = 200) -> int:
    """Take back lapsed leases, across tenants: one batch, one transaction.

    A running task returns to ``pending`` (reason ``LEASE_EXPIRED``) for another
    worker; a person's lapsed claim returns to the queue. Operations the lost holder
    left ``executing`` are made due for recovery now: whether their call happened is
    for the receipt lookup to say, never for a new call. Safe on several workers at
    once (``SKIP LOCKED``); the fencing token is untouched, so the old holder stays
    fenced out by expiry and the next holder's acquisition raises it.
    """
    rows = task_state_write(statement=_REAP, moves=_REAP_MOVES, params={"limit": limit})
    actor = Actor.system("lease-reaper")
    for row in rows:
        previous_state, previous_owner, task = row[0], row[1], task_from_row(row[2:])
        Operation.objects.filter(
            tenant_id=task.tenant_id, task_id=task.pk, state=OperationState.EXECUTING
        ).update(next_check_at=Now())
        audit_services.event_append(
            tenant_id=task.tenant_id,
            code=EventCode.TASK_LEASE_EXPIRED,
            actor=actor,
            task_id=task.pk,
            reason=ReasonCode.LEASE_EXPIRED,
            data=payloads.TaskLeaseExpired(
                {
                    "from": previous_state,
                    "to": task.state,
                    "owner": previous_owner,
                    "lease_token": task.lease_token,
                }
            ),
        )
    metrics.lease_expiries_counted(states=[row[0] for row in rows])
    return len(rows)


_WAKE_MOVES: Final[dict[str, str]] = {TaskState.WAITING: TaskState.PENDING}
_WAKE: Final = TaskStateWrite(
    with_="""WITH due AS (
    SELECT id FROM tasks_task
    WHERE state = 'waiting' AND wake_at <= app_now()
    ORDER BY wake_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)""",
    from_="due",
    where="t.id = due.id",
    assignments=("wake_at = NULL", *_LEASE_CLEARED),
)


@scope.in_tenants_with("tasks_tenants_with_waking_tasks")
@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def unscoped_waiting_tasks_wake(*, limit: int = 200) -> int:
    """Move waiting tasks whose ``wake_at`` is due back to ``pending``, across tenants.

    One batch in one transaction; safe on several workers at once (``SKIP LOCKED``).
    """
    rows = task_state_write(statement=_WAKE, moves=_WAKE_MOVES, params={"limit": limit})
    actor = Actor.system("wake-up")
    for row in rows:
        task = task_from_row(row)
        audit_services.event_append(
            tenant_id=task.tenant_id,
            code=EventCode.TASK_WOKEN,
            actor=actor,
            task_id=task.pk,
            data=payloads.TaskWoken(
                {
                    "from": "waiting",
                    "to": "pending",
                    "state_version": task.state_version,
                }
            ),
        )
    return len(rows)
