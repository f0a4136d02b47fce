"""Writes of tasks, leases, operations and contracts.

Each use-case service is one durable transaction that writes the state change, one
event and (through ``event_append``) one outbox row together (docs/style.md R4, R5).

The hot paths (transition, lease, claim, reserve, outcome) are hand-written single
statements: the guard, the write and the read-back happen in one round trip, so a
zero-row result means "someone moved on" and only then is the row read again to say
why (``STALE_STATE``, ``LEASE_EXPIRED``, ...). Every expiry comparison uses the one
SQL clock, ``app_now()``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from django.db.models.functions import Now

from audit import services as audit_services
from audit.models import EventCode
from audit.redaction import redact, refuse_sensitive
from limits import services as limits_services
from policies import engine as policy_engine
from policies import selectors as policy_selectors
from policies.exceptions import PolicyDenied, PolicyError
from policies.models import PolicySetState
from portal import db as portal_db
from portal import metrics, scope
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
from portal.models import Tenant, TenantPerm
from portal.roles import Person, require_tenant_perm
from portal.tracing import NO_TRACE, Trace

from .. import sealed, selectors
from ..contracts import (
    contract_amount_fields,
    contract_risk_class,
    contract_sensitive_fields,
    contract_spec_validate,
)
from ..credentials import key_id, key_pair_new
from ..exceptions import (
    ActionNotGranted,
    ContractNotFound,
    ContractRetired,
    GatewayGoverned,
    LeaseHeld,
    OperationNotFound,
    TaskIdReused,
    TaskNotFound,
    TaskNotLeasable,
)
from ..hashing import input_hash
from ..models import (
    OPERATION_TRANSITIONS,
    Connector,
    Contract,
    ContractStatus,
    ObjectVersion,
    Operation,
    OperationState,
    Task,
    TaskState,
)
from ..outbound import connector_url_problems
from ..sealed import SETTLED_STATES, seal
from ..task_state import (
    TASK_COLUMNS,
    TASK_STATES,
    TaskStateWrite,
    task_from_row,
    task_moves_to,
    task_state_write,
)

_OPERATION_ATTNAMES, _OPERATION_COLUMNS = portal_db.returning_columns(Operation, "o")

# Legal source states for each target state: the guard travels inside the UPDATE.
_OPERATION_SOURCES: Final[dict[str, list[str]]] = {
    target: sorted(source for source, to in OPERATION_TRANSITIONS if to == target)
    for target in OperationState.values
}
LEASABLE_STATES: Final = (TaskState.PENDING, TaskState.RUNNING, TaskState.WAITING)


def task_sensitive_fields(
    *, tenant_id: uuid.UUID, task_id: uuid.UUID
) -> dict[str, str]:
    """The sensitive fields the task's pinned contract declares (none unpinned)."""
    row = _fetch(
        """
        SELECT c.spec FROM tasks_task AS t
        JOIN tasks_contract AS c ON c.tenant_id = t.tenant_id
            AND c.key = t.contract_key AND c.version = t.contract_version
        WHERE t.tenant_id = %s AND t.id = %s
        """,
        [tenant_id, task_id],
    )
    return contract_sensitive_fields(row[0]) if row else {}


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def _fetch(sql: str, params: Mapping[str, Any] | list[Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _operation(row: tuple[Any, ...]) -> Operation:
    return portal_db.model_from_row(Operation, _OPERATION_ATTNAMES, row)


def _task_refusal(
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    lease_token: int | None,
    expected_version: int | None = None,
    to: str | None = None,
) -> Exception:
    """Why a guarded task write touched no row: reload and name the reason."""
    row = _fetch(
        """
        SELECT state, state_version, lease_token,
               lease_owner IS NOT NULL AND lease_expires_at > app_now()
        FROM tasks_task WHERE tenant_id = %s AND id = %s
        """,
        [tenant_id, task_id],
    )
    if row is None:
        return TaskNotFound(task_id=str(task_id))
    state, state_version, current_token, lease_live = row
    # A newer token means another holder took over: fenced out, whatever else changed.
    if lease_token is not None and current_token != lease_token:
        return LeaseExpired(task_id=str(task_id), lease_token=lease_token)
    # Same token but a newer version: a duplicate of this writer got there first (its
    # move may also have handed the lease back). Reload, never overwrite.
    if expected_version is not None and state_version != expected_version:
        return StaleState(
            task_id=str(task_id),
            expected_state_version=expected_version,
            state_version=state_version,
        )
    if lease_token is not None and not lease_live:
        return LeaseExpired(task_id=str(task_id), lease_token=lease_token)
    return IllegalTransition(task_id=str(task_id), current=state, requested=to)


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
        data={
            "client_task_id": client_task_id,
            "workflow": {"key": workflow_key, "version": workflow_version},
            "object": {"type": object_type, "id": object_id, "version": object_version},
        },
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
        known = redact(
            {
                "to": to,
                "state_version": expected_version + 1,
                "lease_token": lease_token,
                "data": data,
            },
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
    payload = {
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
        data={
            "owner": owner,
            "lease_token": task.lease_token,
            "expires_at": task.lease_expires_at,
            "taken_over_from": previous_owner,
        },
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
        data={
            "owner": previous_owner,
            "lease_token": lease_token,
            "from": previous_state,
            "to": task.state,
        },
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
        data={
            "from": TaskState.PENDING,
            "to": TaskState.RUNNING,
            "owner": owner,
            "lease_token": task.lease_token,
            "state_version": task.state_version,
        },
    )


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
RETURNING {_OPERATION_COLUMNS}
"""


# What a reservation reads before it writes, in one round trip: the agent's grant
# (``portal.selectors.agent_may``'s condition; true for a person or the portal), the
# task's pinned contract spec (its sensitive fields redact the stored input; None
# when unpinned), and whether the tenant has a policy set in force (only then is it
# loaded and evaluated, after the insert).
_RESERVE_CONTEXT = f"""
SELECT
    %(agent_id)s::uuid IS NULL OR {portal_selectors.AGENT_MAY_EXISTS},
    (SELECT c.spec FROM tasks_task AS t
     JOIN tasks_contract AS c ON c.tenant_id = t.tenant_id
         AND c.key = t.contract_key AND c.version = t.contract_version
     WHERE t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s),
    EXISTS (SELECT FROM policies_policyset AS p
            WHERE p.tenant_id = %(tenant_id)s AND p.state = %(published)s)
"""


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
    agent_id = uuid.UUID(actor.id) if actor.type == ActorType.AGENT else None
    context = _fetch(
        _RESERVE_CONTEXT,
        {
            "tenant_id": tenant.pk,
            "task_id": task_id,
            "agent_id": agent_id,
            "action": action,
            "target": target,
            "published": PolicySetState.PUBLISHED,
        },
    )
    granted, spec, policy_set_published = context or (False, None, False)
    if isinstance(spec, str | bytes):  # jsonb arrives as text on Django's connection
        spec = json.loads(spec)
    if agent_id is not None and not granted:
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
            # NO_TRACE: the current span's (portal/tracing.py).
            "trace_id": trace.or_current().trace_id,
            "span_id": trace.or_current().span_id,
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
    operation = _operation(row)
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
            tenant=tenant, agent_id=actor.id, action=action, target=target, input=input
        )
        if actor.type == ActorType.AGENT
        else []
    )
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.OPERATION_RESERVED,
        actor=actor,
        task_id=task_id,
        operation_id=operation.pk,
        trace=trace,
        data={
            "idempotency_key": idempotency_key,
            "action": action,
            "target": target,
            "input_hash": digest,
            "lease_token": lease_token,
            **({"policy": policy.as_evidence()} if policy else {}),
            **({"limits": charges} if charges else {}),
        },
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
    state = %(to)s,
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
RETURNING old.state, {_OPERATION_COLUMNS}
"""

# By the portal itself (recovery) or a person: guarded by the version they read.
_OPERATION_MOVE_AT_VERSION = f"""
UPDATE tasks_operation AS o SET {_OPERATION_SET}
FROM tasks_operation AS old
WHERE o.tenant_id = %(tenant_id)s AND o.id = %(operation_id)s AND old.id = o.id
  AND o.state_version = %(expected_version)s
  AND o.state = ANY(%(sources)s)
RETURNING old.state, {_OPERATION_COLUMNS}
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
    data: Mapping[str, Any] | None = None,
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
        task_id = (
            Operation.objects.filter(tenant=tenant, pk=operation_id)
            .values_list("task_id", flat=True)
            .first()
        )
        sensitive = (
            task_sensitive_fields(tenant_id=tenant.pk, task_id=task_id)
            if task_id
            else {}
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
    previous_state, operation = row[0], _operation(row[1:])
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=_OUTCOME_EVENTS[to],
        actor=actor,
        task_id=operation.task_id,
        operation_id=operation.pk,
        reason=reason,
        trace=trace,
        data={
            "from": previous_state,
            "to": to,
            "attempts": operation.attempts,
            "idempotency_key": operation.idempotency_key,
            "provider_reference": provider_reference,
            "lease_token": lease_token,
            **(data or {}),
        },
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


# --- Contracts and object versions ---------------------------------------------------


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def contract_create(
    *,
    tenant: Tenant,
    key: str,
    spec: Mapping[str, Any],
    publish: bool = False,
    by: Person | None = None,
) -> Contract:
    """Create the next version of a contract, as a draft or published at once.

    ``by`` is the person making the change (checked for ``manage_tenant`` and
    recorded as the actor); ``None`` is the portal itself (commands, the seed).
    Guarantee: the version and its ``contract.created`` event commit together.

    Raises:
        ContractInvalid: the spec fails the contract schema.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    contract_spec_validate(spec)
    latest = Contract.objects.filter(tenant=tenant, key=key).aggregate(v=Max("version"))
    contract = Contract.objects.create(
        tenant=tenant,
        key=key,
        version=(latest["v"] or 0) + 1,
        spec=dict(spec),
        status=ContractStatus.PUBLISHED if publish else ContractStatus.DRAFT,
        published_at=Now() if publish else None,
    )
    contract.refresh_from_db()  # published_at was a database expression
    _contract_event(contract, EventCode.CONTRACT_CREATED, by=by)
    return contract


def _require_manager(*, tenant: Tenant, by: Person | None) -> None:
    if by is not None:
        require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)


def _person_or_portal(by: Person | None) -> Actor:
    return Actor.of_user(by) if by is not None else Actor.system("portal")


def _contract_event(contract: Contract, code: str, *, by: Person | None) -> None:
    audit_services.event_append(
        tenant_id=contract.tenant_id,
        code=code,
        actor=_person_or_portal(by),
        contract=(contract.key, contract.version),
        data={"key": contract.key, "version": contract.version, "to": contract.status},
    )


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def contract_publish(
    *, tenant: Tenant, key: str, version: int, by: Person | None = None
) -> Contract:
    """Publish a draft version; from now on it never changes.

    Raises:
        ContractNotFound: no such version.
        IllegalTransition: the version is not a draft.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    moved = Contract.objects.filter(
        tenant=tenant, key=key, version=version, status=ContractStatus.DRAFT
    ).update(status=ContractStatus.PUBLISHED, published_at=Now())
    contract = selectors.contract_get(tenant=tenant, key=key, version=version)
    if not moved:
        raise IllegalTransition(current=contract.status, requested="published")
    _contract_event(contract, EventCode.CONTRACT_PUBLISHED, by=by)
    return contract


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def contract_retire(
    *, tenant: Tenant, key: str, version: int, by: Person | None = None
) -> Contract:
    """Retire a published version: no new tasks may pin it.

    Raises:
        ContractNotFound: no such version.
        IllegalTransition: the version is not published.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    moved = Contract.objects.filter(
        tenant=tenant, key=key, version=version, status=ContractStatus.PUBLISHED
    ).update(status=ContractStatus.RETIRED, retired_at=Now())
    contract = selectors.contract_get(tenant=tenant, key=key, version=version)
    if not moved:
        raise IllegalTransition(current=contract.status, requested="retired")
    _contract_event(contract, EventCode.CONTRACT_RETIRED, by=by)
    return contract


# What a person may set on a connector (its signing key is the portal's to make).
CONNECTOR_SETTINGS: Final = (
    "base_url",
    "execute_path",
    "lookup_path",
    "reference_field",
    "supports_idempotency_keys",
    "supports_lookup",
    "connect_timeout_s",
    "read_timeout_s",
    "max_attempts",
)
# The settings that say where the gateway calls: the outbound URL policy's.
URL_SETTINGS: Final = ("base_url", "execute_path", "lookup_path")


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def connector_save(
    *,
    tenant: Tenant,
    target: str,
    values: Mapping[str, Any],
    rotate_key: bool = False,
    by: Person | None = None,
) -> Connector:
    """Create the tenant's connector for ``target``, or change it.

    ``values`` are ``CONNECTOR_SETTINGS``. A new connector gets a fresh Ed25519
    signing key pair, and ``rotate_key`` replaces an existing connector's pair; the
    private key is sealed at once (``connector_key_seal``) and never returned, the
    public key and its ``key_id`` are for the target. The event names the settings
    that changed with their old and new values and says whether the key was
    replaced; no key material goes into the trail (nor the key id, which the
    trail's redaction would blank as high-entropy text: the admin page shows it).

    Raises:
        ValidationFailed: unknown setting, or a base URL or path the outbound URL
            policy refuses (``tasks/outbound.py``; checked again at every call).
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    unknown = sorted(set(values) - set(CONNECTOR_SETTINGS))
    if unknown:
        raise ValidationFailed(field=unknown[0])
    connector = (
        Connector.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, target=target)
        .first()
    )
    created = connector is None
    if connector is None:
        connector = Connector(tenant=tenant, target=target)
    # The outbound URL policy's early word; every call checks again (outbound.py).
    for name, problem in connector_url_problems(
        {name: values.get(name, getattr(connector, name)) for name in URL_SETTINGS}
    ):
        raise ValidationFailed(f"{name}: {problem}", field=name)
    changed = {
        name: [None if created else getattr(connector, name), value]
        for name, value in values.items()
        if created or getattr(connector, name) != value
    }
    for name, value in values.items():
        setattr(connector, name, value)
    key_replaced = rotate_key and not created
    if created or rotate_key:
        private_key, connector.public_key = key_pair_new()
        connector.key_id = key_id(connector.public_key)
        connector.sealed_private_key = sealed.connector_key_seal(
            tenant_id=tenant.pk, connector_id=connector.pk, private_key=private_key
        )
        del private_key
    connector.save()
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.CONNECTOR_CREATED if created else EventCode.CONNECTOR_CHANGED,
        actor=_person_or_portal(by),
        data={
            "target": target,
            "changed": changed,
            "signing_key_replaced": key_replaced,
        },
    )
    return connector


@transaction.atomic(durable=True)
def object_version_record(
    *, tenant: Tenant, object_type: str, object_id: str, version: str
) -> ObjectVersion:
    """Record the current version of a business object (the version fence's input)."""
    record, _ = ObjectVersion.objects.update_or_create(
        tenant=tenant,
        object_type=object_type,
        object_id=object_id,
        defaults={"version": version, "updated_at": Now()},
    )
    record.refresh_from_db(fields=["updated_at"])
    return record


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
            data={
                "from": previous_state,
                "to": task.state,
                "owner": previous_owner,
                "lease_token": task.lease_token,
            },
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
            data={
                "from": "waiting",
                "to": "pending",
                "state_version": task.state_version,
            },
        )
    return len(rows)
