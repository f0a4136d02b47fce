"""Writes of the kill switch and the per-agent limits (docs/limits.md).

Freezing is one durable transaction: the flag, the revoked leases and credentials,
and one event naming the person. Admission runs inside the reservation's own
transaction: its first statement reads the flags ``FOR SHARE`` beside its own reads
(``admission_statement``: a freeze waits for reservations already admitted, and
every later one sees it), and ``reservation_admit`` charges each rate limit and
budget with one ``INSERT … ON CONFLICT DO UPDATE … WHERE`` that cannot
take more than the window allows, whatever the number of processes. A refusal rolls
the reservation back; ``refusals_recorded`` then writes it as a denial in a
transaction of its own.
"""

from __future__ import annotations

import decimal
import functools
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, ParamSpec, TypeVar

from django.db import connection, transaction

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal import scope
from portal.actors import Actor, ActorType
from portal.codes import ReasonCode
from portal.exceptions import (
    AgentFrozen,
    BudgetExceeded,
    CallerFrozen,
    PortalError,
    RateLimited,
    TenantFrozen,
    ValidationFailed,
)
from portal.models import Agent, AgentKey, Tenant, TenantPerm
from portal.roles import Person, require_tenant_perm
from portal.tracing import NO_TRACE, Trace

from . import selectors
from .exceptions import AgentNotFound
from .models import Budget, RateLimit

P = ParamSpec("P")
R = TypeVar("R")

# The refusals of this module: each is written as a denial event.
DENIALS: Final = (AgentFrozen, TenantFrozen, RateLimited, BudgetExceeded)
# How many revoked task ids the freeze event lists (the count is always there).
EVENT_TASK_IDS: Final = 100


# --- The kill switch -------------------------------------------------------------


def _actor(by: Person | None, command: str) -> Actor:
    return Actor.of_user(by) if by is not None else Actor.system(command)


# The leases an agent holds: those whose current token it acquired (the acquiring
# event names the agent and the token; tasks record only a free-text owner).
# ``%(agent_id)s IS NULL``: every live lease of the tenant.
_REVOKE_LEASES = """
UPDATE tasks_task AS t
SET lease_expires_at = app_now()
WHERE t.tenant_id = %(tenant_id)s
  AND t.lease_owner IS NOT NULL AND t.lease_expires_at > app_now()
  AND (%(agent_id)s::text IS NULL OR EXISTS (
      SELECT 1 FROM audit_event e
      WHERE e.tenant_id = t.tenant_id AND e.task_id = t.id
        AND e.code IN ('task.lease_acquired', 'task.claimed')
        AND e.actor_type = 'agent' AND e.actor_id = %(agent_id)s::text
        AND e.payload ->> 'lease_token' = t.lease_token::text))
RETURNING t.id
"""

# Live credentials of operations the agent reserved or executed (all, for a tenant).
_REVOKE_CREDENTIALS = """
UPDATE tasks_credential AS c SET revoked_at = app_now()
FROM tasks_operation AS o
WHERE c.tenant_id = %(tenant_id)s AND c.revoked_at IS NULL
  AND c.expires_at > app_now()
  AND o.tenant_id = c.tenant_id AND o.id = c.operation_id
  AND (%(agent_id)s::uuid IS NULL
       OR COALESCE(o.executed_by_agent_id, o.agent_id) = %(agent_id)s::uuid)
RETURNING c.id
"""


def _revoke(*, tenant: Tenant, agent_id: uuid.UUID | None) -> payloads.Revocation:
    """Expire the live leases and revoke the live credentials.

    An expired lease fences its holder out of every write (each compares the expiry
    on the database clock); the token is left alone, as the lease reaper leaves it,
    so an execution queued under it still reaches the gateway's checks and is
    refused there by name (``AGENT_FROZEN``) rather than skipped as taken over.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _REVOKE_LEASES,
            {"tenant_id": tenant.pk, "agent_id": str(agent_id) if agent_id else None},
        )
        tasks = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            _REVOKE_CREDENTIALS, {"tenant_id": tenant.pk, "agent_id": agent_id}
        )
        credentials = cursor.rowcount
    return {
        "revoked_leases": len(tasks),
        "revoked_lease_task_ids": [str(task) for task in tasks[:EVENT_TASK_IDS]],
        "revoked_credentials": credentials,
    }


def _flag(
    table: str, *, tenant: Tenant, row_id: uuid.UUID, on: bool, by: Person | None
) -> None:
    """Set or clear ``frozen_at`` (database clock) and ``frozen_by``."""
    person = by.pk if on and by is not None and by.is_authenticated else None
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET frozen_at = CASE WHEN %s THEN app_now() END, "
            "frozen_by_id = %s WHERE id = %s",
            [on, person, row_id],
        )


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def agent_freeze(
    *,
    tenant: Tenant,
    agent_id: uuid.UUID,
    frozen: bool = True,
    by: Person | None = None,
    command: str = "freeze",
) -> Agent:
    """Freeze (or unfreeze) one agent: every call of it is refused from the commit on.

    Guarantee: the flag, the expiry of the leases it holds (no write under them
    passes; the reaper hands their tasks back), the revocation of the live
    credentials of its operations and one ``agent.changed`` event naming the person (or
    ``system:<command>``) commit together. Waits for reservations and gateway
    checks already admitted (they hold the agent row ``FOR SHARE``). Repeating it
    changes nothing and writes no event.

    Raises:
        AgentNotFound: no such agent in the tenant.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    if by is not None:
        require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)
    agent = (
        Agent.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, pk=agent_id)
        .first()
    )
    if agent is None:
        raise AgentNotFound(agent_id=str(agent_id))
    if (agent.frozen_at is not None) == frozen:
        return agent
    facts = payloads.AgentChanged(
        {"agent_id": str(agent.pk), "frozen": frozen, "agent": agent.name}
    )
    if frozen:
        facts.update(_revoke(tenant=tenant, agent_id=agent.pk))
    _flag("portal_agent", tenant=tenant, row_id=agent.pk, on=frozen, by=by)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.AGENT_CHANGED,
        actor=_actor(by, command),
        reason=ReasonCode.AGENT_FROZEN if frozen else None,
        data=facts,
    )
    agent.refresh_from_db()
    return agent


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def tenant_freeze(
    *,
    tenant: Tenant,
    frozen: bool = True,
    by: Person | None = None,
    command: str = "freeze",
) -> Tenant:
    """Freeze (or unfreeze) a tenant: every call of each of its agents is refused.

    Guarantee: as ``agent_freeze``, for every live lease and credential of the
    tenant, with one ``tenant.changed`` event. People keep working: the takeover
    desk and the admin stay open.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    if by is not None:
        require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)
    locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
    if (locked.frozen_at is not None) == frozen:
        return locked
    facts = payloads.TenantChanged({"frozen": frozen})
    if frozen:
        facts.update(_revoke(tenant=tenant, agent_id=None))
    _flag("portal_tenant", tenant=tenant, row_id=tenant.pk, on=frozen, by=by)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TENANT_CHANGED,
        actor=_actor(by, command),
        reason=ReasonCode.TENANT_FROZEN if frozen else None,
        data=facts,
    )
    locked.refresh_from_db()
    return locked


# --- Admission at reservation ----------------------------------------------------

# The flags and the agent's limits for the action and target, read in the
# reservation's first statement (``admission_statement``): one row per limit, or one
# with no limit. The flags are read FOR SHARE (limits.selectors): a freeze waits for
# the reservation, and one admitted after the freeze sees it. They are locked before
# the task is: a freeze locks the agent (or tenant) row and then expires the task's
# lease, so taking the task first would be the opposite order (docs/limits.md,
# "Lock order").
_ADMISSION = """
SELECT {columns},
       a.frozen_at IS NOT NULL, t.frozen_at IS NOT NULL,
       l.kind, l.id, l.allowed, l.window_s, l.argument
FROM portal_agent a
JOIN portal_tenant t ON t.id = a.tenant_id
LEFT JOIN LATERAL (
    SELECT 'rate' AS kind, r.id, r.max_calls::numeric AS allowed, r.window_s,
           NULL::text AS argument
    FROM limits_ratelimit r
    WHERE r.tenant_id = a.tenant_id AND r.agent_id = a.id
      AND r.action = %(action)s AND r.target IN (%(target)s, '*')
    UNION ALL
    SELECT 'budget', b.id, b.max_total, b.window_s, b.argument
    FROM limits_budget b
    WHERE b.tenant_id = a.tenant_id AND b.agent_id = a.id
      AND b.action = %(action)s AND b.target IN (%(target)s, '*')
) l ON true
WHERE a.tenant_id = %(tenant_id)s AND a.id = %(agent_id)s
FOR SHARE OF a, t
"""
# How many columns ``_ADMISSION`` adds after the caller's.
ADMISSION_COLUMNS: Final = 7


def admission_statement(columns: str) -> str:
    """A statement that reads the caller's ``columns`` beside the agent's flags
    (FOR SHARE) and its limits for an action and target: the caller's own reads and
    the admission in one round trip. Named parameters ``tenant_id``, ``agent_id``,
    ``action``, ``target`` and the caller's own. No row: no such agent in the
    tenant. ``Admission.of(rows)`` reads the last ``ADMISSION_COLUMNS`` columns.
    """
    return _ADMISSION.format(columns=columns)


@dataclass(frozen=True, kw_only=True)
class Admission:
    """What ``admission_statement`` read: the flags, and each limit as
    (kind, id, allowed, window_s, argument)."""

    agent_frozen: bool
    tenant_frozen: bool
    limits: tuple[tuple[Any, ...], ...]

    @classmethod
    def of(cls, rows: list[tuple[Any, ...]]) -> Admission:
        """From the statement's rows (at least one)."""
        own = [row[-ADMISSION_COLUMNS:] for row in rows]
        return cls(
            agent_frozen=bool(own[0][0]),
            tenant_frozen=bool(own[0][1]),
            limits=tuple(
                (kind, limit_id, allowed, window_s, argument)
                for _, _, kind, limit_id, allowed, window_s, argument in own
                if kind is not None
            ),
        )


_WINDOW = (
    "to_timestamp(floor(extract(epoch FROM app_now()) / %(window_s)s) * %(window_s)s)"
)
# One statement per limit: a new window's row, or the current one moved up only if
# it stays within what the limit allows now. No row back: refused. Concurrent
# charges of one window wait on its row and re-check against the committed total.
_CHARGE = f"""
INSERT INTO limits_limitusage AS u (
    id, tenant_id, {{column}}, window_start, used, allowed, updated_at
)
SELECT %(id)s, %(tenant_id)s, %(limit_id)s, {_WINDOW}, %(amount)s, %(allowed)s,
       statement_timestamp()
WHERE %(amount)s <= %(allowed)s
ON CONFLICT (tenant_id, {{column}}, window_start) WHERE {{column}} IS NOT NULL
DO UPDATE SET used = u.used + EXCLUDED.used, allowed = EXCLUDED.allowed,
              updated_at = EXCLUDED.updated_at
WHERE u.used + EXCLUDED.used <= EXCLUDED.allowed
RETURNING u.used, u.window_start + make_interval(secs => %(window_s)s) - app_now()
"""
_CHARGE_RATE = _CHARGE.format(column="rate_limit_id")
_CHARGE_BUDGET = _CHARGE.format(column="budget_id")
_USED = f"""
SELECT used, {_WINDOW} + make_interval(secs => %(window_s)s) - app_now()
FROM limits_limitusage
WHERE tenant_id = %(tenant_id)s AND {{column}} = %(limit_id)s
  AND window_start = {_WINDOW}
"""


def amount_of(value: Any, argument: str) -> Decimal | None:
    """The non-negative number at ``argument`` (dotted path) of an input, or None."""
    for part in argument.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        return None
    try:
        amount = Decimal(str(value))
    except decimal.InvalidOperation:
        return None
    return amount if amount.is_finite() and amount >= 0 else None


def agent_admit(*, tenant: Tenant, agent_id: uuid.UUID | str) -> None:
    """Refuse a frozen agent or tenant, holding the flags until the caller commits.

    Raises:
        TransactionRequired: no transaction is open.
        AgentFrozen, TenantFrozen: the flag is set.
    """
    reason = selectors.frozen_reason(tenant=tenant, agent_id=agent_id)
    if reason == ReasonCode.AGENT_FROZEN:
        raise AgentFrozen(tenant_id=tenant.pk, agent_id=str(agent_id))
    if reason == ReasonCode.TENANT_FROZEN:
        raise TenantFrozen(tenant_id=tenant.pk, agent_id=str(agent_id))


def reservation_admit(
    *,
    tenant: Tenant,
    agent_id: uuid.UUID | str,
    admission: Admission,
    input: Any,
) -> list[dict[str, Any]]:
    """Refuse a frozen agent or tenant; charge the agent's rate limits and budgets.

    ``admission``: the flags and limits ``admission_statement`` read in this
    transaction (the flags are still share-locked). Runs in the reservation's
    transaction (a refusal rolls the reservation back and every charge with it);
    call it once per *new* reservation, never for a replay. Returns the charges,
    for the ``operation.reserved`` event.

    Raises:
        TransactionRequired: no transaction is open.
        AgentFrozen, TenantFrozen: the flag is set.
        RateLimited: a rate limit's window is full (``retry_after_s``: its end).
        BudgetExceeded: the amount would take a budget's window over its total,
            or the input holds no amount at the budget's argument.
    """
    portal_db.require_transaction()
    if admission.agent_frozen:
        raise AgentFrozen(tenant_id=tenant.pk, agent_id=str(agent_id))
    if admission.tenant_frozen:
        raise TenantFrozen(tenant_id=tenant.pk, agent_id=str(agent_id))
    if not admission.limits:
        return []
    with connection.cursor() as cursor:
        charges = []
        for kind, limit_id, allowed, window_s, argument in admission.limits:
            amount = Decimal(1) if kind == "rate" else amount_of(input, argument)
            facts = {"limit": kind, "limit_id": str(limit_id), "window_s": window_s}
            if amount is None:
                raise BudgetExceeded(
                    "The input holds no non-negative amount at the budget's "
                    "argument; nothing ran.",
                    argument=argument,
                    **facts,
                )
            charge = {
                "id": uuid.uuid4(),
                "tenant_id": tenant.pk,
                "limit_id": limit_id,
                "amount": amount,
                "allowed": allowed,
                "window_s": window_s,
            }
            cursor.execute(_CHARGE_RATE if kind == "rate" else _CHARGE_BUDGET, charge)
            charged = cursor.fetchone()
            if charged is None:
                column = "rate_limit_id" if kind == "rate" else "budget_id"
                cursor.execute(_USED.format(column=column), charge)
                used, left = cursor.fetchone() or (Decimal(0), None)
                retry_after_s = max(1, int(left.total_seconds()) + 1) if left else 1
                if kind == "rate":
                    raise RateLimited(
                        "The agent's rate limit for this action is spent for the "
                        "window; retry after Retry-After seconds.",
                        max_calls=int(allowed),
                        retry_after_s=retry_after_s,
                        **facts,
                    )
                raise BudgetExceeded(
                    argument=argument,
                    amount=str(amount),
                    used=str(used),
                    max_total=str(allowed),
                    retry_after_s=retry_after_s,
                    **facts,
                )
            charges.append({**facts, "amount": str(amount), "used": str(charged[0])})
    return charges


# --- Denials ---------------------------------------------------------------------


@transaction.atomic(durable=True)
def denial_record(
    *,
    tenant_id: uuid.UUID,
    agent_id: uuid.UUID | str | None,
    error: PortalError,
    phase: str,
    task_id: uuid.UUID | None = None,
    trace: Trace = NO_TRACE,
    **facts: Any,
) -> None:
    """Write one refused call as a denial: a ``gateway.checked`` event, ``refused``,
    with the reason code and the refusal's facts (not published to the outbox).

    ``phase``: where it was refused (``api``, ``reserve``, ``lease``).
    """
    with scope.tenant_scope([tenant_id]):
        audit_services.event_append(
            tenant_id=tenant_id,
            code=EventCode.GATEWAY_CHECKED,
            actor=(
                Actor(type=ActorType.AGENT, id=str(agent_id))
                if agent_id
                else Actor.system("portal")
            ),
            task_id=task_id,
            reason=str(error.code),
            trace=trace,
            # The refusal's context and facts vary with the error, so they go in
            # untyped, after (and over) the typed keys, as they always did.
            data={
                **payloads.GatewayChecked(
                    {"check": "limits", "verdict": "refused", "phase": phase}
                ),
                **error.context,
                **facts,
            },
            publish=False,
        )


def key_refusal_record(
    *, key: AgentKey, status: str, address: str, method: str, path: str
) -> None:
    """Write one request refused for a known key that no longer authenticates
    (``status``: ``revoked`` or ``expired``) as an ``agent_key.refused`` event in
    the key's tenant: the exact secret of a retired key is in someone's hands. The
    key's prefix names it; the secret is never written. Bounded by the failed
    authentication throttle: past it the answer is 429 and nothing is written.
    """
    with transaction.atomic(durable=True), scope.tenant_scope([key.tenant_id]):
        audit_services.event_append(
            tenant_id=key.tenant_id,
            code=EventCode.AGENT_KEY_REFUSED,
            actor=Actor(type=ActorType.AGENT, id=str(key.agent_id)),
            data=payloads.AgentKeyRefused(
                {
                    "code": f"API_KEY_{status.upper()}",  # the answer's problem code
                    "agent_id": str(key.agent_id),
                    "key_prefix": key.prefix,
                    "status": status,
                    "address": address[:90],
                    "method": method,
                    "path": path[:200],
                }
            ),
            publish=False,
        )


def refusals_recorded(phase: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Write a service's kill-switch and limit refusals as denials, after its
    transaction rolled back (so the refusal leaves its event and nothing else).

    Goes above ``@transaction.atomic``; reads ``tenant``, ``actor`` and ``task_id``
    from the service's keyword arguments.
    """

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return func(*args, **kwargs)
            except DENIALS as error:
                tenant = kwargs["tenant"]
                actor = kwargs.get("actor")
                assert isinstance(tenant, Tenant)
                denial_record(
                    tenant_id=tenant.pk,
                    agent_id=(
                        actor.id
                        if isinstance(actor, Actor) and actor.type == ActorType.AGENT
                        else None
                    ),
                    error=error,
                    phase=phase,
                    task_id=kwargs.get("task_id"),  # type: ignore[arg-type]
                )
                if isinstance(error, CallerFrozen):
                    error.recorded = True
                raise

        return wrapper

    return decorate


# --- Managing limits -------------------------------------------------------------


def _limit_event(
    *,
    tenant: Tenant,
    agent_id: uuid.UUID,
    by: Person | None,
    change: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.AGENT_CHANGED,
        actor=_actor(by, "limits"),
        data=payloads.AgentChanged(
            {
                "agent_id": str(agent_id),
                "change": change,
                "before": before,
                "after": after,
            }
        ),
    )


def _limit_facts(limit: RateLimit | Budget) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "action": limit.action,
        "target": limit.target,
        "window_s": limit.window_s,
    }
    if isinstance(limit, RateLimit):
        return {"rate_limit_id": str(limit.pk), "max_calls": limit.max_calls, **facts}
    return {
        "budget_id": str(limit.pk),
        "argument": limit.argument,
        "max_total": str(limit.max_total),
        **facts,
    }


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def limit_save(
    *, tenant: Tenant, limit: RateLimit | Budget, by: Person | None = None
) -> RateLimit | Budget:
    """Add or change a rate limit or budget of one of the tenant's agents.

    Guarantee: the row and one ``agent.changed`` event (``change``:
    ``rate_limit.saved``/``budget.saved``, old and new values) commit together. A
    changed limit applies to the current window from the next charge on.

    Raises:
        ValidationFailed: the agent is not the tenant's.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        IntegrityViolation: the same agent, action and target already has one.
    """
    if by is not None:
        require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)
    if not Agent.objects.filter(tenant=tenant, pk=limit.agent_id).exists():
        raise ValidationFailed("No such agent in this tenant.", field="agent")
    model = type(limit)
    old = model.objects.filter(tenant=tenant, pk=limit.pk).first()
    limit.tenant = tenant
    limit.save()
    kind = "rate_limit" if isinstance(limit, RateLimit) else "budget"
    _limit_event(
        tenant=tenant,
        agent_id=limit.agent_id,
        by=by,
        change=f"{kind}.saved",
        before=_limit_facts(old) if old is not None else None,
        after=_limit_facts(limit),
    )
    return limit


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def limit_delete(
    *, tenant: Tenant, limit: RateLimit | Budget, by: Person | None = None
) -> None:
    """Remove a rate limit or budget (its usage rows go with it), with one event.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    if by is not None:
        require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)
    kind = "rate_limit" if isinstance(limit, RateLimit) else "budget"
    facts = _limit_facts(limit)
    type(limit).objects.filter(tenant=tenant, pk=limit.pk).delete()
    _limit_event(
        tenant=tenant,
        agent_id=limit.agent_id,
        by=by,
        change=f"{kind}.deleted",
        before=facts,
        after=None,
    )
