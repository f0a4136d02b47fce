"""Evaluate a tenant's Cedar policy set for one governed action (docs/policies.md).

Default deny, forbid wins (Cedar's own semantics), and fail closed: a set that does
not parse, a policy that errors while it is evaluated (Cedar skips such a policy,
which could let a ``permit`` through that a broken ``forbid`` should have stopped),
and anything cedarpy raises all give ``POLICY_ERROR``, never an allow.

An allow whose determining ``permit`` policies carry ``@approval("<group>")`` (and
``@quorum("<n>")``, ``@approval_ttl_s("<s>")``, ``@separate_from_sponsor("true")``)
asks for people first (tasks/approvals.py); ``@credential_ttl_s("<s>")`` lowers the
credential's lifetime. Annotations are read from the parsed set (policy id ->
annotations), so the ids Cedar reports map back to them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import json
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import cedarpy

from portal.codes import ReasonCode
from portal.models import Agent, Tenant, TrustTier

from .models import PolicySet

# Parsed sets kept per process: published versions never change (migration 0002),
# and a draft's text is the key, so an edited draft is parsed again.
_CACHE_SIZE: Final = 128
WEEKDAYS: Final = (
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday",
)  # fmt: skip


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    APPROVAL = "approval"  # allowed once a person approves
    ERROR = "error"


REASONS: Final[dict[Verdict, ReasonCode]] = {
    Verdict.DENY: ReasonCode.POLICY_DENIED,
    Verdict.APPROVAL: ReasonCode.APPROVAL_REQUIRED,
    Verdict.ERROR: ReasonCode.POLICY_ERROR,
}


@dataclass(frozen=True, kw_only=True)
class AgentFacts:
    """What a policy sees of the agent (``principal``), read from its row."""

    name: str = ""
    sponsor: str = ""  # the sponsor's username; "" when it has none
    trust_tier: str = TrustTier.STANDARD
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PolicyRequest:
    """What a policy sees of one governed action: the values are as stored
    (redacted), so the what-if over stored operations sees what the gateway saw.

    ``amount_fields`` are the contract's declared amounts (None: the contract
    declares none, and every number counts); ``risk_class`` is the contract's.
    """

    agent_id: str
    agent_name: str
    agent_sponsor: str = ""  # the sponsor's username; "" when it has none
    agent_trust_tier: str = TrustTier.STANDARD
    agent_tags: tuple[str, ...] = ()
    action: str
    target: str
    object_type: str
    object_id: str
    object_version: str
    arguments: Any
    fields: Mapping[str, Any] = field(default_factory=dict)
    contract_key: str = ""
    contract_version: int = 0
    amount_fields: tuple[str, ...] | None = None
    risk_class: str = ""
    phase: str = "execute"  # or "reserve"
    at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A policy set's answer for one request, as the event records it."""

    verdict: Verdict
    determining: tuple[str, ...] = ()
    approval: Mapping[str, Any] | None = None
    credential_ttl_s: int | None = None
    error: str | None = None
    policy_set_id: str | None = None
    version: int | None = None

    @property
    def reason(self) -> ReasonCode | None:
        return REASONS.get(self.verdict)

    def as_evidence(self) -> dict[str, Any]:
        """The decision for an event or an escalation's evidence."""
        evidence: dict[str, Any] = {
            "version": self.version,
            "policy_set_id": self.policy_set_id,
            "verdict": str(self.verdict),
            "determining": list(self.determining),
        }
        if self.approval is not None:
            evidence["approval"] = dict(self.approval)
        if self.credential_ttl_s is not None:
            evidence["credential_ttl_s"] = self.credential_ttl_s
        if self.error is not None:
            evidence["error"] = self.error
        return evidence


@dataclass(frozen=True)
class _Compiled:
    policies: cedarpy.PolicySet
    annotations: Mapping[str, Mapping[str, str]]  # policy id -> its annotations


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _compiled(text: str) -> _Compiled:
    """Parse once per text. Raises ``ValueError`` when the text does not parse."""
    policies = cedarpy.PolicySet.from_str(text)
    parsed = json.loads(cedarpy.policies_to_json_str(text))
    if parsed.get("templates"):
        raise ValueError("templates (?principal, ?resource) are not supported")
    annotations = {
        policy_id: dict(policy.get("annotations") or {})
        for policy_id, policy in parsed.get("staticPolicies", {}).items()
    }
    return _Compiled(policies=policies, annotations=annotations)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _whole(value: Any) -> int | None:
    """A number as a whole number (fractions rounded away from zero), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return int(math.ceil(value) if value >= 0 else math.floor(value))
    return value


def request_amounts(request: PolicyRequest) -> dict[str, int]:
    """The request's amounts as whole numbers: its declared amount fields (or,
    when the contract declares none, every number), from its arguments and its
    checked field values (a field's value wins over an argument's)."""
    arguments = request.arguments if isinstance(request.arguments, Mapping) else {}
    amounts: dict[str, int] = {}
    declared = request.amount_fields
    for values in (arguments, request.fields):
        for name, value in values.items():
            if declared is not None and name not in declared:
                continue
            number = _whole(value)
            if number is not None:
                amounts[str(name)] = number
    return amounts


def cedar_request(request: PolicyRequest) -> tuple[dict[str, Any], list[Any]]:
    """The Cedar request and its entities (docs/policies.md, "The entity model")."""
    arguments = request.arguments if isinstance(request.arguments, Mapping) else {}
    fields = {
        name: _text(value)
        for name, value in request.fields.items()
        if value is not None
    }
    amounts = request_amounts(request)
    declared = request.amount_fields
    target = {"type": "Target", "id": request.target}
    resource = {
        "type": "BusinessObject",
        "id": f"{request.object_type}:{request.object_id}",
    }
    at = request.at.astimezone(dt.UTC)
    entities = [
        {
            "uid": {"type": "Agent", "id": request.agent_id},
            "attrs": {
                "name": request.agent_name,
                "sponsor": request.agent_sponsor,
                "trust_tier": request.agent_trust_tier,
                "tags": sorted(request.agent_tags),
            },
            "parents": [],
        },
        {"uid": target, "attrs": {}, "parents": []},
        {
            "uid": resource,
            "attrs": {
                "type": request.object_type,
                "id": request.object_id,
                "version": request.object_version,
            },
            "parents": [target],
        },
        {
            "uid": {"type": "Arguments", "id": "request"},
            "attrs": {},
            "parents": [],
            "tags": {
                str(name): _text(value)
                for name, value in arguments.items()
                if value is not None
            },
        },
        {
            # Declared amounts are attributes (context.amounts.amount) and tags.
            "uid": {"type": "Amounts", "id": "request"},
            "attrs": amounts if declared is not None else {},
            "parents": [],
            "tags": amounts,
        },
    ]
    cedar = {
        "principal": {"type": "Agent", "id": request.agent_id},
        "action": {"type": "Action", "id": request.action},
        "resource": resource,
        "context": {
            "action": request.action,
            "target": request.target,
            "phase": request.phase,
            "contract": request.contract_key,
            "contract_version": request.contract_version,
            "risk_class": request.risk_class,
            "time": {
                "weekday": WEEKDAYS[at.weekday()],
                "hour": at.hour,
                "date": at.date().isoformat(),
            },
            "input": {"__entity": {"type": "Arguments", "id": "request"}},
            "amounts": {"__entity": {"type": "Amounts", "id": "request"}},
            "fields": fields,
        },
    }
    return cedar, entities


def _name(policy_id: str, annotations: Mapping[str, Mapping[str, str]]) -> str:
    """A policy's ``@id`` where it has one, else the parser's ``policyN``."""
    return annotations.get(policy_id, {}).get("id") or policy_id


def evaluate_text(*, text: str, request: PolicyRequest) -> Decision:
    """Evaluate Cedar ``text`` for ``request``; never raises (errors deny)."""
    try:
        compiled = _compiled(text)
        cedar, entities = cedar_request(request)
        result = cedarpy.is_authorized(cedar, compiled.policies, entities)
        decision = result.decision
        reasons = list(result.diagnostics.reasons)
        errors = list(result.diagnostics.errors)
    except Exception as error:  # noqa: BLE001
        return Decision(verdict=Verdict.ERROR, error=f"{type(error).__name__}: {error}")
    annotations = compiled.annotations
    determining = tuple(_name(policy_id, annotations) for policy_id in reasons)
    if errors:
        return Decision(
            verdict=Verdict.ERROR, determining=determining, error="; ".join(errors)
        )
    if decision != cedarpy.Decision.Allow:
        if decision != cedarpy.Decision.Deny:
            return Decision(verdict=Verdict.ERROR, error=f"decision {decision}")
        return Decision(verdict=Verdict.DENY, determining=determining)
    return _allowed(reasons=reasons, annotations=annotations, determining=determining)


def _allowed(
    *,
    reasons: Sequence[str],
    annotations: Mapping[str, Mapping[str, str]],
    determining: tuple[str, ...],
) -> Decision:
    """An allow, with what the determining permits' annotations ask for."""
    groups: list[str] = []
    quorum = 0
    ttls: list[int] = []
    approval_ttls: list[int] = []
    separate = False
    try:
        for policy_id in reasons:
            notes = annotations.get(policy_id, {})
            if "approval" in notes:
                groups.append(notes["approval"])
                quorum = max(quorum, int(notes.get("quorum") or 1))
                if "approval_ttl_s" in notes:
                    approval_ttls.append(int(notes["approval_ttl_s"]))
                separate = separate or (
                    notes.get("separate_from_sponsor", "").lower() == "true"
                )
            if "credential_ttl_s" in notes:
                ttls.append(int(notes["credential_ttl_s"]))
    except ValueError as error:
        # Checked at publish; a stored set that slipped past still fails closed.
        return Decision(
            verdict=Verdict.ERROR, determining=determining, error=f"annotation: {error}"
        )
    ttl = min(ttls) if ttls else None
    if groups:
        return Decision(
            verdict=Verdict.APPROVAL,
            determining=determining,
            approval={
                "groups": sorted(set(groups)),
                "quorum": quorum,
                # The tightest window and the strictest separation of the permits.
                **({"ttl_s": min(approval_ttls)} if approval_ttls else {}),
                **({"separate_from_sponsor": True} if separate else {}),
            },
            credential_ttl_s=ttl,
        )
    return Decision(
        verdict=Verdict.ALLOW, determining=determining, credential_ttl_s=ttl
    )


def agent_facts(*, tenant: Tenant, agent_ids: Iterable[str]) -> dict[str, AgentFacts]:
    """Each agent's facts by id, in one query; ids that are no agent of the tenant
    (the portal itself, a queued run's SYSTEM) are left out."""
    pks = set()
    for agent_id in agent_ids:
        try:
            pks.add(uuid.UUID(agent_id))
        except ValueError:
            continue
    rows = Agent.objects.filter(tenant=tenant, pk__in=pks).values_list(
        "pk", "name", "sponsor__username", "trust_tier", "tags"
    )
    return {
        str(pk): AgentFacts(
            name=name,
            sponsor=sponsor or "",
            trust_tier=trust_tier,
            tags=tuple(tags or ()),
        )
        for pk, name, sponsor, trust_tier, tags in rows
    }


def request_for(
    *,
    tenant: Tenant,
    agent_id: str,
    action: str,
    target: str,
    object_type: str,
    object_id: str,
    object_version: str,
    arguments: Any,
    fields: Mapping[str, Any] | None = None,
    contract_key: str | None = None,
    contract_version: int | None = None,
    amount_fields: Sequence[str] | None = None,
    risk_class: str = "",
    phase: str,
    at: dt.datetime,
    agent: AgentFacts | None = None,
) -> PolicyRequest:
    """The request for one action; reads the agent's facts unless they are given.

    ``arguments`` and ``fields`` must be the redacted values (as stored);
    ``amount_fields`` and ``risk_class`` are the contract's declarations
    (tasks/contracts.py).
    """
    if agent is None:
        agent = agent_facts(tenant=tenant, agent_ids=[agent_id]).get(
            agent_id, AgentFacts()
        )
    return PolicyRequest(
        agent_id=agent_id,
        agent_name=agent.name,
        agent_sponsor=agent.sponsor,
        agent_trust_tier=agent.trust_tier,
        agent_tags=agent.tags,
        action=action,
        target=target,
        object_type=object_type,
        object_id=object_id,
        object_version=object_version,
        arguments=arguments,
        fields=dict(fields or {}),
        contract_key=contract_key or "",
        contract_version=contract_version or 0,
        amount_fields=tuple(amount_fields) if amount_fields is not None else None,
        risk_class=risk_class,
        phase=phase,
        at=at,
    )


def evaluate(*, policy_set: PolicySet, request: PolicyRequest) -> Decision:
    """Evaluate the tenant's policy set in force for ``request``; never raises."""
    return dataclasses.replace(
        evaluate_text(text=policy_set.text, request=request),
        policy_set_id=str(policy_set.pk),
        version=policy_set.version,
    )
