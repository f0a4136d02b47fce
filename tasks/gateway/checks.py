"""The gateway's checks, each a function of what the execution knows so far.

``CHECKS`` lists them in the order of docs/gateway.md; ``execute.authorize`` runs them
as a loop. Each returns ``Passed`` (its facts), a ``Refusal`` (the reason and the
evidence), or None when it does not apply (not listed). The pass writes one
``gateway.checked`` event listing every verdict (``checks_recorded``); the first
refusal ends the pass and hands the task to a person (``refuse``).

0. ``frozen``: neither the executing agent nor its tenant is frozen
   (``AGENT_FROZEN``, ``TENANT_FROZEN``; docs/limits.md);
1. ``contract``: the pinned contract version is not retired (``CONTRACT_RETIRED``);
2. ``fields``: every required field is present, from the contract's source and fresh
   enough (``FIELD_MISSING``, ``FIELD_SOURCE_MISMATCH``, ``FIELD_STALE``);
3. ``target``: a contract write target with a connector (``TARGET_FORBIDDEN``);
4. ``permission``: the *caller's* own grant (an agent) or ``work_takeover`` role (a
   person) still holds *now* (``PERMISSION_REVOKED``);
5. ``policy``: the tenant's Cedar policy set in force, if it has one, permits it
   (``POLICY_DENIED``, ``POLICY_ERROR``), or asks for a person's approval first
   (``APPROVAL_REQUIRED``); grants stay the coarse layer (docs/policies.md);
6. ``version``: the object version the task read is current (``VERSION_CONFLICT``);
7. ``approval``: a connector without idempotency keys and lookup, or a policy's
   ``@approval``, needs people's approval of this exact input and these field
   values, used once (``APPROVAL_REQUIRED``; tasks/approvals.py).

The credential (step 8) is issued after the loop and checked right before the call
(``call.begin_call``); the ``operation.executing`` event records it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from django.contrib.auth.models import User
from django.db import connection

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from audit.redaction import redact
from limits import selectors as limits_selectors
from policies import engine as policy_engine
from policies.models import PolicySet, PolicySetState
from portal import db as portal_db
from portal import metrics
from portal import selectors as portal_selectors
from portal.actors import Actor, ActorType
from portal.codes import ReasonCode
from portal.models import Tenant, TenantPerm
from portal.roles import has_tenant_perm
from portal.tracing import Trace

from .. import approvals, escalation
from ..contracts import (
    contract_amount_fields,
    contract_risk_class,
    contract_sensitive_fields,
)
from ..models import (
    Connector,
    Contract,
    ContractStatus,
    ObjectVersion,
    Operation,
    Task,
)
from .common import plan
from .results import GatewayResult, Refused

# A future observed_at beyond this is a clock or provenance problem, not freshness.
MAX_CLOCK_SKEW: Final = dt.timedelta(minutes=5)


@dataclass(frozen=True, kw_only=True)
class FieldValue:
    """A field the agent read, with its provenance."""

    name: str
    value: Any
    source: str
    observed_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class CheckReads:
    """The rows the checks read, read at once after the lock: the pinned contract,
    the target's connector, the object's current version and the tenant's policy
    set in force (each None when there is none)."""

    contract: Contract | None
    connector: Connector | None
    object_version: ObjectVersion | None
    policy_set: PolicySet | None


_READ_MODELS: Final = (
    ("c", Contract),
    ("cn", Connector),
    ("ov", ObjectVersion),
    ("ps", PolicySet),
)
_READ_COLUMNS: Final = tuple(
    portal_db.returning_columns(model, alias) for alias, model in _READ_MODELS
)
# One statement for four ORM queries: the gateway runs it on every execute, where
# each query's building cost more than its database work. Every join is on a unique
# key (the policy set in force: the partial unique index on the published one).
_CHECK_READS: Final = f"""
SELECT {", ".join(columns for _attnames, columns in _READ_COLUMNS)}
FROM (SELECT) AS one
LEFT JOIN tasks_contract AS c ON c.tenant_id = %(tenant_id)s
    AND c.key = %(contract_key)s AND c.version = %(contract_version)s
LEFT JOIN tasks_connector AS cn ON cn.tenant_id = %(tenant_id)s
    AND cn.target = %(target)s
LEFT JOIN tasks_objectversion AS ov ON ov.tenant_id = %(tenant_id)s
    AND ov.object_type = %(object_type)s AND ov.object_id = %(object_id)s
LEFT JOIN policies_policyset AS ps ON ps.tenant_id = %(tenant_id)s
    AND ps.state = %(published)s
"""


def check_reads(*, tenant: Tenant, task: Task, operation: Operation) -> CheckReads:
    """The rows the checks read, in one statement (``CheckReads``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _CHECK_READS,
            {
                "tenant_id": tenant.pk,
                "contract_key": task.contract_key,
                "contract_version": task.contract_version,
                "target": operation.target,
                "object_type": task.object_type,
                "object_id": task.object_id,
                "published": PolicySetState.PUBLISHED.value,
            },
        )
        row = cursor.fetchone()
    assert row is not None  # the FROM is one row
    found: list[Any] = []
    start = 0
    for (_alias, model), (attnames, _columns) in zip(
        _READ_MODELS, _READ_COLUMNS, strict=True
    ):
        values = row[start : start + len(attnames)]
        start += len(attnames)
        found.append(portal_db.joined_model_from_row(model, attnames, values))
    contract, connector, object_version, policy_set = found
    return CheckReads(
        contract=contract,
        connector=connector,
        object_version=object_version,
        policy_set=policy_set,
    )


@dataclass(kw_only=True)
class CheckContext:
    """What the checks read; ``connector`` is filled in by the target check."""

    tenant: Tenant
    task: Task
    operation: Operation
    contract: Contract
    fields: Sequence[FieldValue]
    now: dt.datetime
    actor: Actor
    trace: Trace
    # What the target, policy and version checks read (``check_reads``).
    reads: CheckReads
    connector: Connector | None = None
    # Set by the policy check: what a policy's annotations ask of the later steps.
    approval_requested: Mapping[str, Any] | None = None
    credential_ttl_s: int | None = None

    @property
    def spec(self) -> dict[str, Any]:
        return self.contract.spec

    def ttl_s(self) -> int:
        """The credential's lifetime: the contract's, or a policy's if shorter."""
        ttl = int(self.spec["policy"]["credential_ttl_s"])
        return min(ttl, self.credential_ttl_s) if self.credential_ttl_s else ttl


@dataclass(frozen=True)
class Passed:
    """The check passed; ``facts`` join its entry in the pass's ``gateway.checked``
    event."""

    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """The check refused: the reason code and the evidence for the person."""

    reason: ReasonCode
    evidence: Mapping[str, Any]


Verdict = Passed | Refusal | None
Check = Callable[[CheckContext], Verdict]


def check_entry(name: str, verdict: Passed | Refusal) -> dict[str, Any]:
    """One check's line in its pass's event: its name, verdict, facts or evidence."""
    if isinstance(verdict, Refusal):
        return {"check": name, "verdict": "refused", **verdict.evidence}
    return {"check": name, "verdict": "passed", **verdict.facts}


def checks_recorded(
    *,
    tenant: Tenant,
    operation: Operation,
    checks: Sequence[Mapping[str, Any]],
    reason: str | None,
    actor: Actor,
    trace: Trace,
    contract: Contract | None,
) -> None:
    """Write one check pass as one ``gateway.checked`` event (not published) and
    count each check's verdict (``portal_gateway_verdicts_total``) once it commits.

    ``checks``: every check that ran, in order, each ``check_entry``; a refusal is
    the last and names the pass's ``reason``. The event's payload is ``verdict``
    (``passed`` or ``refused``), ``checks``, and on a refusal ``check``, the name of
    the check that refused (its evidence is in its entry).
    """
    refused_by = checks[-1]["check"] if reason else None
    data = payloads.GatewayChecked(
        {"verdict": "refused" if reason else "passed", "checks": list(checks)}
    )
    if refused_by is not None:
        data["check"] = refused_by
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.GATEWAY_CHECKED,
        actor=actor,
        task_id=operation.task_id,
        operation_id=operation.pk,
        reason=reason,
        contract=(contract.key, contract.version) if contract else None,
        trace=trace,
        data=data,
        publish=False,
    )
    for entry in checks:
        metrics.gateway_verdict_counted(
            check=entry["check"],
            reason=reason if entry["check"] == refused_by else None,
        )


def refuse(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation,
    reason: ReasonCode,
    check: str,
    actor: Actor,
    trace: Trace,
    contract: Contract | None,
    passed: Sequence[Mapping[str, Any]] = (),
    **evidence: Any,
) -> Refused:
    """Write the pass's event (the checks ``passed`` before, then this refusal),
    hand the task to a person, report it."""
    checks_recorded(
        tenant=tenant,
        operation=operation,
        checks=[*passed, check_entry(check, Refusal(reason, evidence))],
        reason=reason,
        actor=actor,
        trace=trace,
        contract=contract,
    )
    record = escalation.escalate(
        tenant=tenant,
        task=task,
        operation=operation,
        reason=reason,
        evidence={"plan": plan(operation, task), **evidence},
        actor=actor,
        trace=trace,
    )
    operation.refresh_from_db()
    return Refused(
        result=GatewayResult(
            outcome="refused",
            operation=operation,
            reason=reason,
            escalation_id=record.pk,
        )
    )


def field_problems(
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


def check_frozen(context: CheckContext) -> Verdict:
    """0. The kill switch: the executing agent (a queued run's too) and its tenant.

    Read under a share lock held until the checks commit, so a freeze waits for an
    authorisation already under way and none passes after it. A person's own
    execution is not an agent call: only a frozen tenant stops the system actor.
    """
    actor = context.actor
    if actor.type == ActorType.USER:
        return None
    reason = limits_selectors.frozen_reason(
        tenant=context.tenant,
        agent_id=actor.id if actor.type == ActorType.AGENT else None,
    )
    if reason is not None:
        return Refusal(reason, {"actor_type": actor.type, "actor_id": actor.id})
    return None


def check_contract(context: CheckContext) -> Verdict:
    """1. The pinned contract version is still in force."""
    if context.contract.status == ContractStatus.RETIRED:
        return Refusal(
            ReasonCode.CONTRACT_RETIRED, {"contract_status": context.contract.status}
        )
    return Passed()


def check_fields(context: CheckContext) -> Verdict:
    """2. Fields: present, from the right source, fresh."""
    reason, problems = field_problems(
        spec=context.spec, fields=context.fields, now=context.now
    )
    if reason is not None:
        return Refusal(reason, {"conflicting_fields": problems})
    return Passed({"fields": [field.name for field in context.fields]})


def check_target(context: CheckContext) -> Verdict:
    """3. The target is allowed by the contract, and reachable (has a connector)."""
    operation = context.operation
    write_targets = context.spec["policy"]["write_targets"]
    context.connector = context.reads.connector
    if operation.target not in write_targets or context.connector is None:
        return Refusal(
            ReasonCode.TARGET_FORBIDDEN,
            {
                "target": operation.target,
                "write_targets": write_targets,
                "connector_configured": context.connector is not None,
            },
        )
    return Passed({"target": operation.target})


def caller_may_execute(*, tenant: Tenant, operation: Operation, actor: Actor) -> bool:
    """Whether the caller's *own* authority covers this execution, now.

    An agent needs its own grant for the action and target (not the grant of the
    agent that reserved: whoever holds the lease executes under its own authority).
    A person executes under their ``work_takeover`` role in the tenant. The portal
    itself holds no authority to start a call.
    """
    if actor.type == ActorType.AGENT:
        return portal_selectors.agent_may(
            tenant=tenant,
            agent_id=actor.id,
            action=operation.action,
            target=operation.target,
        )
    if actor.type == ActorType.USER:
        user = User.objects.filter(pk=actor.id, is_active=True).first()
        return user is not None and has_tenant_perm(
            user=user, perm=TenantPerm.WORK_TAKEOVER, tenant=tenant
        )
    return False


def check_permission(context: CheckContext) -> Verdict:
    """4. The caller's own grant (an agent) or role (a person), re-checked now."""
    operation = context.operation
    actor = context.actor
    if not caller_may_execute(tenant=context.tenant, operation=operation, actor=actor):
        who = "agent_id" if actor.type == ActorType.AGENT else f"{actor.type}_id"
        return Refusal(
            ReasonCode.PERMISSION_REVOKED,
            {
                who: actor.id,
                "actor_type": actor.type,
                "action": operation.action,
                "target": operation.target,
                "reserved_by_agent_id": str(operation.agent_id),
            },
        )
    return Passed({"executed_by": {"type": actor.type, "id": actor.id}})


def _approval_wanted(
    context: CheckContext, requested: Mapping[str, Any], evidence: Mapping[str, Any]
) -> approvals.Wanted:
    """The operation's approval of this input and these field values, or a new
    request for one (what the approvers see: the redacted arguments, the evidence)."""
    operation = context.operation
    return approvals.approval_for_execution(
        tenant=context.tenant,
        operation=operation,
        digest=approvals.field_digest(context.fields),
        requested=requested,
        asked={
            "action": operation.action,
            "target": operation.target,
            "idempotency_key": operation.idempotency_key,
            "arguments": operation.input,  # stored redacted
            "fields": redact(
                {field.name: field.value for field in context.fields},
                tenant_id=context.tenant.pk,
                sensitive=contract_sensitive_fields(context.spec),
            ),
            **evidence,
        },
        now=context.now,
        actor=context.actor,
        trace=context.trace,
    )


def check_policy(context: CheckContext) -> Verdict:
    """5. The tenant's Cedar policies, re-evaluated now (docs/policies.md).

    None when the tenant has no policy set in force (grants alone decide) and for a
    person's own execution (their role governs it). An ``@approval`` passes only
    with an approved approval of this input and these field values (its quorum of
    distinct approvers reached, in its window); the approval check uses it up.
    """
    operation = context.operation
    actor = context.actor
    if actor.type == ActorType.USER:
        return None
    policy_set = context.reads.policy_set
    if policy_set is None:
        return None
    task = context.task
    agent = operation.executed_by_agent_id or operation.agent_id
    request = policy_engine.request_for(
        tenant=context.tenant,
        agent_id=actor.id if actor.type == ActorType.AGENT else str(agent or ""),
        action=operation.action,
        target=operation.target,
        object_type=task.object_type,
        object_id=task.object_id,
        object_version=task.object_version,
        arguments=operation.input,  # stored redacted: what the what-if sees too
        fields=redact(
            {field.name: field.value for field in context.fields},
            tenant_id=context.tenant.pk,
            sensitive=contract_sensitive_fields(context.spec),
        ),
        contract_key=context.contract.key,
        contract_version=context.contract.version,
        amount_fields=contract_amount_fields(context.spec),
        risk_class=contract_risk_class(context.spec),
        phase="execute",
        at=context.now,
    )
    decision = policy_engine.evaluate(policy_set=policy_set, request=request)
    evidence = {"policy": decision.as_evidence()}
    if decision.verdict == policy_engine.Verdict.APPROVAL:
        assert decision.approval is not None
        wanted = _approval_wanted(context, decision.approval, evidence)
        if not wanted.usable:
            return Refusal(
                ReasonCode.APPROVAL_REQUIRED, {**evidence, **wanted.evidence}
            )
        context.approval_requested = decision.approval
    elif decision.reason is not None:
        return Refusal(decision.reason, evidence)
    context.credential_ttl_s = decision.credential_ttl_s
    return Passed(evidence)


def version_conflict_evidence(
    *, task: Task, current: ObjectVersion | None, fields: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """What a person needs for a version conflict (seed 004): the version read and
    the current one, the fields read at the old version (name, source, read time;
    their values stay out), and who was responsible. The plan is added by refuse."""
    return {
        "version_read": task.object_version,
        "current_version": current.version if current else None,
        "conflicting_fields": [
            {
                "field": item["name"],
                "source": item.get("source"),
                "observed_at": item.get("observed_at"),
                "read_at_version": task.object_version,
                "problem": "object changed since it was read",
            }
            for item in fields
        ],
        "responsible_owner": task.lease_owner,
    }


def check_version(context: CheckContext) -> Verdict:
    """6. Version fence: what the task read must still be current."""
    task = context.task
    current = context.reads.object_version
    if current is None or current.version != task.object_version:
        return Refusal(
            ReasonCode.VERSION_CONFLICT,
            version_conflict_evidence(
                task=task,
                current=current,
                fields=[
                    {
                        "name": f.name,
                        "source": f.source,
                        "observed_at": f.observed_at.isoformat(),
                    }
                    for f in context.fields
                ],
            ),
        )
    return Passed({"version": current.version})


def check_approval(context: CheckContext) -> Verdict:
    """7. A connector that cannot settle doubt, or a policy's ``@approval``, needs
    people's approval of this exact input and these field values, used once.

    Uses the approval up (in the checks' transaction) when there is one: one
    approval of this input answers both. Without one, a request is asked (quorum 1,
    anyone at the desk, for the connector's case) and the evidence says why.
    """
    connector = context.connector
    assert connector is not None  # the target check ran first
    if connector.automatic_writes and context.approval_requested is None:
        return None
    digest = approvals.field_digest(context.fields)
    used = approvals.approval_consume(
        tenant=context.tenant,
        operation=context.operation,
        digest=digest,
        now=context.now,
        actor=context.actor,
        trace=context.trace,
    )
    if used is None:
        evidence: dict[str, Any] = {
            "supports_idempotency_keys": connector.supports_idempotency_keys,
            "supports_lookup": connector.supports_lookup,
        }
        if context.approval_requested is not None:
            evidence["policy_approval"] = context.approval_requested
        wanted = _approval_wanted(context, context.approval_requested or {}, evidence)
        return Refusal(ReasonCode.APPROVAL_REQUIRED, {**evidence, **wanted.evidence})
    return Passed({"approval_id": str(used.pk), "field_digest": digest})


CHECKS: Final[tuple[tuple[str, Check], ...]] = (
    ("frozen", check_frozen),
    ("contract", check_contract),
    ("fields", check_fields),
    ("target", check_target),
    ("permission", check_permission),
    ("policy", check_policy),
    ("version", check_version),
    ("approval", check_approval),
)
"""The checks in order, by the name their entry in ``gateway.checked`` carries."""
