"""One task's story: its task, operation, credential, escalation, event and outbox
rows, with the codes, actors and payloads the services write."""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass
from typing import Any

from audit import chain
from tasks.credentials import USE_EXECUTE, USE_LOOKUP
from tasks.gateway.call import LOOKUP_EXTRA_TTL_S
from tasks.hashing import input_hash
from tasks.takeover import HUMAN_LEASE_HOURS

from .rows import (
    ACTION,
    CHECKS,
    CONTRACT_KEY,
    ESCALATION_REASONS,
    FAILURE_REASONS,
    MAX_EVENTS_PER_TASK,
    MIN_EVENTS_PER_TASK,
    OPERATION_VERSIONS,
    REFUSED_BY,
    SUMMARIES,
    TARGET,
    UNPUBLISHED,
    VIA_PERSON_SHARE,
    WORKFLOW,
    Chunk,
    Ids,
    TenantSetUp,
    dumps,
    iso,
    quoted,
)

# --- Event counts --------------------------------------------------------------------


def event_count(
    rng: random.Random, *, remaining_events: int, remaining_tasks: int
) -> int:
    """Events for the next task, 5-15, so that the remaining ones still fit exactly.

    Drawn around the mean still needed, so the totals come out exact and the counts
    spread over the whole range when the mean allows.
    """
    rest = remaining_tasks - 1
    low = max(MIN_EVENTS_PER_TASK, remaining_events - MAX_EVENTS_PER_TASK * rest)
    high = min(MAX_EVENTS_PER_TASK, remaining_events - MIN_EVENTS_PER_TASK * rest)
    mean = remaining_events / remaining_tasks
    width = min(mean - MIN_EVENTS_PER_TASK, MAX_EVENTS_PER_TASK - mean, 5.0)
    drawn = rng.randint(math.floor(mean - width), math.ceil(mean + width))
    return min(max(drawn, low), high)


# --- One task's story ----------------------------------------------------------------


@dataclass(kw_only=True)
class _Story:
    """Builds one task's rows; events are appended in time order."""

    chunk: Chunk
    rng: random.Random
    ids: Ids
    tenant: TenantSetUp
    task_id: str
    trace_id: str
    contract: tuple[str, int] | None
    agent_id: str
    at: dt.datetime
    outbox_share: float
    state_version: int = 1
    lease_token: int = 0
    operation_id: str | None = None
    events: int = 0
    # The task's hash chain (audit/chain.py): its head.
    prev_hash: str | None = None

    def tick(self, low_ms: float = 5, high_ms: float = 1500) -> dt.datetime:
        self.at += dt.timedelta(milliseconds=self.rng.uniform(low_ms, high_ms))
        return self.at

    def event(
        self,
        code: str,
        data: dict[str, Any],
        *,
        actor: tuple[str, str] | None = None,
        reason: str | None = None,
        operation: bool = True,
        contract: bool = False,
        moves_task: bool = False,
    ) -> str:
        at = self.tick()
        if moves_task:
            self.state_version += 1
        actor_type, actor_id = actor or ("agent", self.agent_id)
        event_id = self.ids.at(at)
        operation_id = self.operation_id if operation else None
        contract_key, contract_version = (
            self.contract if contract and self.contract else (None, None)
        )
        payload = dumps(data)
        tenant_id = self.tenant.id
        span_id = self.ids.hex(16)
        content = chain.event_content(
            event_id=event_id, tenant_id=tenant_id, task_id=self.task_id,
            operation_id=operation_id, code=code, actor_type=actor_type,
            actor_id=actor_id, reason_code=reason, contract_key=contract_key,
            contract_version=contract_version, payload=data, trace_id=self.trace_id,
            span_id=span_id, created_at=at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )  # fmt: skip
        digest = chain.event_hash(prev_hash=self.prev_hash, content=content)
        self.events += 1
        self.chunk.add(
            "audit_event",
            (
                event_id, tenant_id, self.task_id, operation_id, code, actor_type,
                actor_id, reason, contract_key, contract_version, payload,
                self.trace_id, span_id, at, self.events, self.prev_hash, digest,
            ),
        )  # fmt: skip
        self.prev_hash = digest
        if code not in UNPUBLISHED and self.rng.random() < self.outbox_share:
            self._outbox(event_id, code, operation_id, reason, payload, at)
        return event_id

    def _outbox(
        self,
        event_id: str,
        code: str,
        operation_id: str | None,
        reason: str | None,
        payload: str,
        at: dt.datetime,
    ) -> None:
        # The envelope event_append writes, key for key.
        envelope = (
            f'{{"schema_version":1,"event_id":"{event_id}","code":"{code}",'
            f'"tenant_id":"{self.tenant.id}","task_id":"{self.task_id}",'
            f'"operation_id":{quoted(operation_id)},"reason_code":{quoted(reason)},'
            f'"data":{payload},"trace_id":"{self.trace_id}"}}'
        )
        roll = self.rng.random()
        age = dt.datetime.now(dt.UTC) - at
        if age < dt.timedelta(minutes=2) or roll < 0.001:
            state, attempts, sent_at, error = "pending", 0, None, ""
        elif roll < 0.0015:
            state, attempts, sent_at = "dead", 8, None
            error = "HTTP 503 from downstream after 8 attempts"
        else:
            state, attempts, error = "sent", 1, ""
            sent_at = at + dt.timedelta(milliseconds=self.rng.uniform(20, 900))
        self.chunk.add(
            "audit_outbox",
            (
                self.ids.at(at), self.tenant.id, event_id, code, event_id, envelope,
                state, attempts, at, sent_at, error, at,
            ),
        )  # fmt: skip


def task_story(
    *,
    chunk: Chunk,
    rng: random.Random,
    ids: Ids,
    tenant: TenantSetUp,
    index: int,
    state: str,
    events: int,
    created_at: dt.datetime,
    outbox_share: float,
) -> None:
    """Add one task of ``state`` with exactly ``events`` events (5-15) to ``chunk``."""
    agent_id, agent_name = rng.choice(tenant.agents)
    owner = f"{agent_name}/worker-{rng.randint(1, 4)}"
    pinned = rng.random() < 0.9
    contract = (CONTRACT_KEY, tenant.contract_version) if pinned else None
    client_task_id = f"scale-{index:08d}"
    object_id = f"ISSUE-{index:08d}"
    object_version = f"v{rng.randint(1, 6)}"
    details: dict[str, str | int | None] = {
        "client_task_id": client_task_id,
        "workflow_key": WORKFLOW[0],
        "workflow_version": WORKFLOW[1],
        "contract_key": contract[0] if contract else None,
        "contract_version": contract[1] if contract else None,
        "object_type": "customer_issue",
        "object_id": object_id,
        "object_version": object_version,
    }
    task_id = ids.at(created_at)
    story = _Story(
        chunk=chunk,
        rng=rng,
        ids=ids,
        tenant=tenant,
        task_id=task_id,
        trace_id=ids.hex(32),
        contract=contract,
        agent_id=agent_id,
        at=created_at,
        outbox_share=outbox_share,
    )
    story.at -= dt.timedelta(milliseconds=5)  # the first tick lands on created_at
    via_person = (
        state == "succeeded" and events >= 12 and rng.random() < VIA_PERSON_SHARE
    )
    if state == "human_claimed" and events < 6:
        state = "human_required"  # a claim needs one event more than the minimum
    with_operation = state != "succeeded" or events >= 7

    story.event(
        "task.registered",
        {
            "client_task_id": client_task_id,
            "workflow": {"key": WORKFLOW[0], "version": WORKFLOW[1]},
            "object": {
                "type": "customer_issue",
                "id": object_id,
                "version": object_version,
            },
        },
        operation=False,
        contract=True,
    )
    created_at = story.at

    def claimed() -> None:
        story.lease_token += 1
        story.event(
            "task.claimed",
            {
                "from": "pending", "to": "running", "owner": owner,
                "lease_token": story.lease_token,
                "state_version": story.state_version + 1,
            },
            operation=False,
            moves_task=True,
        )  # fmt: skip

    def lease_expired() -> None:
        """The reaper takes back a lease its owner let run out."""
        story.tick(60_000, 120_000)
        story.event(
            "task.lease_expired",
            {
                "from": "running",
                "to": "pending",
                "owner": owner,
                "lease_token": story.lease_token,
            },
            actor=("system", "lease-reaper"),
            reason="LEASE_EXPIRED",
            operation=False,
            moves_task=True,
        )

    def transitioned(
        to: str, *, reason: str | None = None, step: str = "", source: str = "running"
    ) -> None:
        story.event(
            "task.transitioned",
            {
                "from": source, "to": to, "state_version": story.state_version + 1,
                "step": step, "lease_token": story.lease_token, "data": {},
            },
            reason=reason,
            operation=False,
            moves_task=True,
        )  # fmt: skip

    claimed()
    if not with_operation:  # a short succeeded story without a side effect
        if events == 5:
            lease_expired()
        else:
            transitioned("waiting", step="await-crm")
            story.tick(30_000, 600_000)
            story.event(
                "task.woken",
                {
                    "from": "waiting",
                    "to": "pending",
                    "state_version": story.state_version + 1,
                },
                actor=("system", "wake-up"),
                operation=False,
                moves_task=True,
            )
        claimed()
        transitioned("succeeded", step="done")
        _task_row(story, details, state="succeeded", created_at=created_at)
        return

    idempotency_key = f"{client_task_id}:{ACTION}"
    operation_input: dict[str, str | int | None] = {
        "issue_id": object_id,
        "summary": rng.choice(SUMMARIES),
        "priority": rng.choice(("low", "normal", "normal", "high")),
    }
    digest = input_hash(operation_input)
    story.operation_id = ids.at(story.tick())
    operation_created = story.at
    story.event(
        "operation.reserved",
        {
            "idempotency_key": idempotency_key, "action": ACTION, "target": TARGET,
            "input_hash": digest, "lease_token": story.lease_token,
        },
    )  # fmt: skip

    # How many events the ending takes; the rest are gateway check passes (and, for
    # a call that went out, the receipt lookup).
    ending = {
        "succeeded": 9 if via_person else 4,
        "failed": 2,
        "cancelled": 2,
        "pending": 1,
        "running": 0,
        "waiting": 1,
        "human_required": 2,
        "human_claimed": 3,
    }[state]
    middle = events - 3 - ending
    calls = state == "succeeded"
    reason = None
    if state == "failed":
        reason = rng.choice(FAILURE_REASONS)
    elif state in ("human_required", "human_claimed"):
        reason = rng.choice(ESCALATION_REASONS)
    elif via_person:
        reason = "RESULT_UNKNOWN"
    extras = []
    if calls and not via_person:
        extras = ["receipt.queried"][: max(0, middle - 1)]  # when there is room
    passes = middle - len(extras)
    for i in range(passes):
        refused = reason is not None and state == "failed" and i == passes - 1
        _checked(story, reason=reason if refused else None)

    operation_state, provider_reference, attempts, lookups = "reserved", None, 0, 0
    operation_reason: str | None = None
    next_check_at = None
    if calls:
        operation_state, attempts = "executing", 1
        issued = _credentials(story, object_id=object_id, at=story.tick())
        story.event(
            "operation.executing",
            {
                "from": "reserved", "to": "executing", "attempts": 1,
                "idempotency_key": idempotency_key, "provider_reference": None,
                "lease_token": story.lease_token,
                "executed_by": {"type": "agent", "id": agent_id},
                "checks": [
                    {"check": "credential", "verdict": "passed",
                     "credential_id": issued[0]["credential_id"]},
                ],
                "issued": issued,
            },
        )  # fmt: skip
        provider_reference = f"T-{rng.randint(10**7, 10**8 - 1)}"
        outcome = "failed" if via_person else "succeeded"
        story.event(
            "connector.called",
            {
                "attempt": 1, "outcome": outcome, "status": 504 if via_person else 201,
                "error": "read timeout" if via_person else "",
                "provider_reference": None if via_person else provider_reference,
                "retry_after_s": None, "duration_ms": rng.randint(40, 900),
                "credentials_revoked": _spent(story, issued),
            },
        )  # fmt: skip
        if "receipt.queried" in extras:
            lookups = 1
            story.event(
                "receipt.queried",
                {
                    "outcome": "found", "receipts": [provider_reference], "count": 1,
                    "purpose": "confirm", "error": "",
                },
            )  # fmt: skip
        if via_person:
            lookups = 1  # the recovery's receipt lookup
            _via_person(story, reason="RESULT_UNKNOWN", idempotency_key=idempotency_key,
                        provider_reference=provider_reference, owner=owner)  # fmt: skip
        else:
            story.event(
                "operation.verified",
                {
                    "from": "executing", "to": "verified", "attempts": 1,
                    "idempotency_key": idempotency_key,
                    "provider_reference": provider_reference,
                    "lease_token": story.lease_token,
                },
            )  # fmt: skip
            transitioned("succeeded", step="done")
        operation_state = "verified"
    elif state in ("failed", "cancelled"):
        operation_state = "failed"
        operation_reason = reason
        story.event(
            "operation.failed",
            {
                "from": "reserved", "to": "failed", "attempts": 0,
                "idempotency_key": idempotency_key, "provider_reference": None,
                "lease_token": story.lease_token,
            },
            reason=reason,
        )  # fmt: skip
        transitioned(state, reason=reason, step="create-ticket")
    elif state == "pending":
        lease_expired()
    elif state == "waiting":
        transitioned("waiting", step="await-crm")
    elif state in ("human_required", "human_claimed"):
        assert reason is not None
        operation_state = "human_required"
        operation_reason = reason
        _escalate(story, reason=reason, idempotency_key=idempotency_key, owner=owner,
                  digest=digest, from_state="reserved")  # fmt: skip
        if state == "human_claimed":
            user_id = rng.choice(story.tenant.support_user_ids)
            story.lease_token += 1
            story.event(
                "task.human_claimed",
                {"lease_token": story.lease_token, "from": "human_required",
                 "to": "human_claimed"},
                actor=("user", str(user_id)),
                reason=reason,
                operation=False,
                moves_task=True,
            )  # fmt: skip
            owner = f"user:{user_id}"

    story.chunk.add(
        "tasks_operation",
        (
            story.operation_id, tenant.id, task_id, idempotency_key, ACTION, TARGET,
            digest, dumps(operation_input), agent_id, agent_id if calls else None,
            dumps({"email": "c***@example.com"}) if calls else None,
            operation_state, OPERATION_VERSIONS[operation_state] + 2 * via_person,
            operation_reason, attempts, lookups, next_check_at, provider_reference,
            dumps({"ticket_id": provider_reference}) if calls else None,
            story.trace_id, ids.hex(16), operation_created, story.at,
        ),
    )  # fmt: skip
    _task_row(
        story,
        details,
        state=state,
        created_at=created_at,
        reason=reason if state != "succeeded" else None,
        owner=owner,
    )


def _checked(story: _Story, *, reason: str | None) -> None:
    """One gateway check pass as one ``gateway.checked`` event, as
    ``tasks.gateway.checks.checks_recorded`` writes it: every check that ran, in
    order; a refusal is the last and names the pass's ``reason``."""
    refused_by = REFUSED_BY[reason] if reason else None
    ran = CHECKS[: CHECKS.index(refused_by) + 1] if refused_by else CHECKS
    data: dict[str, Any] = {
        "verdict": "refused" if refused_by else "passed",
        "checks": [
            {"check": name, "verdict": "refused" if name == refused_by else "passed"}
            for name in ran
        ],
    }
    if refused_by:
        data["check"] = refused_by
    story.event("gateway.checked", data, reason=reason, contract=True)


def _credentials(
    story: _Story, *, object_id: str, at: dt.datetime
) -> list[dict[str, Any]]:
    """The call's credentials, as ``tasks.gateway.call.authorize_call`` issues them:
    an ``execute`` one bound to the fields and a ``lookup`` one for the receipt; their
    facts go in the ``operation.executing`` event (``credential_facts``)."""
    issued = []
    for use, fields, ttl_s in (
        (USE_EXECUTE, ["email"], 60),
        (USE_LOOKUP, [], 60 + LOOKUP_EXTRA_TTL_S),
    ):
        credential_id = story.ids.at(at)
        expires_at = at + dt.timedelta(seconds=ttl_s)
        story.chunk.add(
            "tasks_credential",
            (
                credential_id, story.tenant.id, story.operation_id, "customer_issue",
                object_id, dumps(fields), ACTION, TARGET, story.ids.hex(64), at,
                expires_at, None,
            ),
        )  # fmt: skip
        issued.append(
            {
                "credential_id": credential_id, "use": use, "action": ACTION,
                "target": TARGET, "fields": fields, "expires_at": iso(expires_at),
                "ttl_s": ttl_s,
            }
        )  # fmt: skip
    story.at -= dt.timedelta(milliseconds=5)  # the event lands on the issue time
    return issued


def _spent(story: _Story, issued: list[dict[str, Any]]) -> list[str]:
    """The call's credentials, revoked as it is recorded (``tasks.gateway.results``
    ``credentials_spend``: each was good for one request): their rows get the
    ``connector.called`` event's time, which is the next tick."""
    spent = sorted(credential["credential_id"] for credential in issued)
    rows = story.chunk.rows["tasks_credential"]
    revoked_at = story.at + dt.timedelta(milliseconds=5)  # at or before the event
    for i in range(len(rows) - len(issued), len(rows)):
        rows[i] = (*rows[i][:-1], revoked_at)
    return spent


def _evidence(story: _Story, *, reason: str, digest: str, owner: str) -> dict[str, Any]:
    plan = {"action": ACTION, "target": TARGET, "input_hash": digest}
    if reason == "VERSION_CONFLICT":
        read = story.rng.randint(1, 5)
        return {
            "plan": plan,
            "read_version": f"v{read}",
            "current_version": f"v{read + 1}",
            "conflicting_fields": ["email"],
            "responsible_owner": owner,
        }
    if reason == "FIELD_STALE":
        return {
            "plan": plan,
            "field": "email",
            "source": "crm",
            "max_age_s": 300,
            "age_s": story.rng.randint(301, 5000),
            "responsible_owner": owner,
        }
    if reason == "APPROVAL_REQUIRED":
        return {
            "plan": plan,
            "connector": {"supports_idempotency_keys": False, "supports_lookup": False},
            "responsible_owner": owner,
        }
    return {"plan": plan, "receipts": [], "attempts": 1, "responsible_owner": owner}


def _escalate(
    story: _Story,
    *,
    reason: str,
    idempotency_key: str,
    owner: str,
    digest: str,
    from_state: str,
) -> str:
    """operation.escalated, the escalation row and task.escalated (as the gateway)."""
    story.event(
        "operation.escalated",
        {
            "from": from_state, "to": "human_required", "attempts": 1,
            "idempotency_key": idempotency_key, "provider_reference": None,
            "lease_token": story.lease_token,
        },
        reason=reason,
    )  # fmt: skip
    story.lease_token += 1
    at = story.tick()
    escalation_id = story.ids.at(at)
    evidence = _evidence(story, reason=reason, digest=digest, owner=owner)
    story.chunk.add(
        "tasks_escalation",
        (
            escalation_id, story.tenant.id, story.task_id, story.operation_id, reason,
            dumps(evidence), owner, at, None, None, "",
        ),
    )  # fmt: skip
    story.at -= dt.timedelta(milliseconds=5)
    story.event(
        "task.escalated",
        {
            "escalation_id": escalation_id, "task_moved": True,
            "lease_token": story.lease_token, "evidence": evidence,
        },
        reason=reason,
        moves_task=True,
    )  # fmt: skip
    return escalation_id


def _via_person(
    story: _Story,
    *,
    reason: str,
    idempotency_key: str,
    provider_reference: str,
    owner: str,
) -> None:
    """The call's answer was lost; a person found the receipt and completed the task.

    Seven events after connector.called: nine with the call itself.
    """
    story.event(
        "operation.unknown",
        {
            "from": "executing", "to": "unknown", "attempts": 1,
            "idempotency_key": idempotency_key, "provider_reference": None,
            "lease_token": story.lease_token, "call": "timeout",
        },
        reason=reason,
    )  # fmt: skip
    story.event(
        "receipt.queried",
        # as tasks.gateway.recovery writes it: the lookup's status and number, the
        # credential it was issued (none here: the call's lookup one was spent)
        {
            "outcome": "none",
            "receipts": [],
            "count": 0,
            "status": 200,
            "error": "",
            "lookup": 1,
            "issued": [],
        },
        actor=("system", "gateway"),
    )
    _escalate(story, reason=reason, idempotency_key=idempotency_key, owner=owner,
              digest="", from_state="unknown")  # fmt: skip
    user_id = story.rng.choice(story.tenant.support_user_ids)
    person = ("user", str(user_id))
    story.tick(60_000, 3_600_000)
    story.lease_token += 1
    story.event(
        "task.human_claimed",
        {"lease_token": story.lease_token, "from": "human_required",
         "to": "human_claimed"},
        actor=person,
        reason=reason,
        operation=False,
        moves_task=True,
    )  # fmt: skip
    story.tick(30_000, 900_000)
    story.event(
        "operation.verified",
        {
            "from": "human_required", "to": "verified", "attempts": 1,
            "idempotency_key": idempotency_key,
            "provider_reference": provider_reference, "lease_token": story.lease_token,
        },
        actor=person,
    )  # fmt: skip
    story.event(
        "task.resolved",
        {
            "resolution": "complete", "from": "human_claimed", "to": "succeeded",
            "provider_reference": provider_reference,
            "note": "Ticket found in the desk; completed by hand.",
        },
        actor=person,
        reason=reason,
        moves_task=True,
    )  # fmt: skip
    # The escalation this story made is resolved: patch its row in place.
    rows = story.chunk.rows["tasks_escalation"]
    row = rows[-1]
    rows[-1] = (*row[:8], story.at, user_id, "complete")


def _task_row(
    story: _Story,
    details: dict[str, str | int | None],
    *,
    state: str,
    created_at: dt.datetime,
    reason: str | None = None,
    owner: str = "",
) -> None:
    lease: tuple[str | None, dt.datetime | None, dt.datetime | None] = (
        None,
        None,
        None,
    )
    wake_at = None
    if state == "running":
        lease = (owner, story.at, story.at + dt.timedelta(minutes=5))
    elif state == "human_claimed":
        lease = (owner, story.at, story.at + dt.timedelta(hours=HUMAN_LEASE_HOURS))
    elif state == "waiting":
        # Due in the future: a steady portal's waker has woken the overdue ones.
        wake_at = max(story.at, dt.datetime.now(dt.UTC)) + dt.timedelta(
            minutes=story.rng.randint(5, 240)
        )
    step = {"succeeded": "done", "waiting": "await-crm", "pending": ""}.get(
        state, "create-ticket"
    )
    story.chunk.add(
        "tasks_task",
        (
            story.task_id, story.tenant.id, details["client_task_id"],
            input_hash(details), details["workflow_key"], details["workflow_version"],
            details["contract_key"], details["contract_version"],
            details["object_type"], details["object_id"], details["object_version"],
            state, story.state_version, step, wake_at, reason, lease[0],
            story.lease_token, lease[1], lease[2], story.trace_id, story.ids.hex(16),
            created_at, story.at,
        ),
    )  # fmt: skip
