"""``manage.py load_scale_data``: a realistic data set at scale, via COPY (dev only).

    manage.py load_scale_data --tasks 1000000 --events 10000000 --tenants 20
        [--outbox N] [--seed S] [--append]

What it makes:

- ``--tenants`` tenants ``scale-t01`` … with skewed sizes (tenant *n* gets a share
  proportional to 1/n, so ``scale-t01`` is the largest), each with a reviewer, a
  support user and a tenant admin (``reviewer-t03``, ``support-t03``, ``admin-t03``,
  password ``scale-demo-password``), three agents, the ``customer-issue`` contract
  and the ``ticket-desk`` connector. These go through the services, as an admin
  would make them, so memberships carry their object permissions.
- Tasks in a realistic mix of states (mostly succeeded; some failed, cancelled,
  pending, running, waiting; about 0.5 % waiting for a person, with escalations and
  evidence, a few of them claimed), their operations and credentials, and 5-15
  events per task with the codes, actors (agent, user, system), payloads and reason
  codes the services write. A task's events share its trace id; each has its own
  span id. Finished tasks are spread over the last 90 days; unfinished ones over
  the time they plausibly stay so (running: the last hour; pending: two days;
  waiting: a week; escalations: two weeks).
- The gateway's events as it writes them now: one ``gateway.checked`` per check
  pass (every check that ran, a refusal last), and a call's credentials (execute
  and lookup) listed in its ``operation.executing`` event.
- One outbox row per published event, as ``event_append`` writes them
  (``gateway.checked`` is not published), mostly sent, a few pending or dead;
  ``--outbox N`` keeps only about N of them.

Rows go in through ``COPY … FROM STDIN`` in chunks of tasks, one transaction per
chunk, so constraints, composite foreign keys and triggers all apply (nothing is
disabled) and an interrupted load leaves whole tasks only. ``--writers`` threads
(default 2), each on its own connection, COPY chunks while the next is built. Ids
are UUIDv7 built from each row's own timestamp, as ``portal.ids.new_id`` would have
made them then.

``--tasks`` and ``--events`` are totals for the database: a run tops it up to them
(so a second run after an interruption finishes the load) and refuses when the
database already holds that many; ``--append`` adds that many on top instead.
Progress goes to stderr: a live line on a terminal, a line every few seconds
otherwise (``nohup … > load.log``).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from audit import chain
from portal import scope, services
from portal.models import Agent, Role, Tenant
from tasks import services as task_services
from tasks.credentials import USE_EXECUTE, USE_LOOKUP
from tasks.gateway import checks as gateway_checks
from tasks.gateway.call import LOOKUP_EXTRA_TTL_S
from tasks.hashing import input_hash
from tasks.models import Connector, Contract
from tasks.takeover import HUMAN_LEASE_HOURS

from . import seed_demo

# Development-only credentials, printed on purpose; production refuses to load.
PASSWORD: Final = "scale-demo-password"  # noqa: S105
ROLES: Final = (
    ("reviewer", Role.REVIEWER),
    ("support", Role.SUPPORT),
    ("admin", Role.ADMIN),
)
AGENTS_PER_TENANT: Final = 3
# The demo's workflow: the same contract, connector target and action.
CONTRACT_KEY: Final = seed_demo.CONTRACT_KEY
CONTRACT_SPEC: Final = seed_demo.CONTRACT_SPEC
TARGET: Final = seed_demo.TICKETDESK_TARGET
ACTION: Final = seed_demo.TICKETDESK_ACTION
WORKFLOW: Final = ("customer-issue-to-ticket", "1.4.0")
MIN_EVENTS_PER_TASK: Final = 5
MAX_EVENTS_PER_TASK: Final = 15
HISTORY: Final = dt.timedelta(days=90)
CHUNK_TASKS: Final = 2000

# The state mix of loaded tasks, by weight (unfinished ones spread over the time
# they plausibly stay so: see _created_at); a share of the succeeded ones went
# through a person (escalated, claimed, completed with a receipt) when long enough.
STATE_MIX: Final = (
    ("succeeded", 0.885),
    ("failed", 0.04),
    ("cancelled", 0.015),
    ("pending", 0.015),
    ("running", 0.002),
    ("waiting", 0.038),
    ("human_required", 0.004),
    ("human_claimed", 0.001),
)
VIA_PERSON_SHARE: Final = 0.05
ESCALATION_REASONS: Final = ("VERSION_CONFLICT", "FIELD_STALE", "APPROVAL_REQUIRED")
FAILURE_REASONS: Final = (
    "FIELD_STALE",
    "FIELD_MISSING",
    "PERMISSION_REVOKED",
    "TARGET_FORBIDDEN",
    "VERSION_CONFLICT",
)
# An operation's state_version after the path the loader gives it (one more per
# move); the path through a person adds unknown and human_required on the way.
OPERATION_VERSIONS: Final = {
    "reserved": 1,
    "failed": 2,
    "human_required": 2,
    "verified": 3,
}
# The gateway's checks in the order one pass runs them (tasks/gateway/checks.py),
# and the check that refuses each failure reason the loader gives.
CHECKS: Final = tuple(name for name, _ in gateway_checks.CHECKS)
REFUSED_BY: Final = {
    "FIELD_STALE": "fields",
    "FIELD_MISSING": "fields",
    "PERMISSION_REVOKED": "permission",
    "TARGET_FORBIDDEN": "target",
    "VERSION_CONFLICT": "version",
}
# Codes the services write without an outbox row (event_append(publish=False)).
UNPUBLISHED: Final = frozenset({"gateway.checked"})
SUMMARIES: Final = (
    "Customer cannot log in",
    "Invoice shows the wrong plan",
    "Password reset mail never arrives",
    "Export stuck at 99 %",
    "Refund requested for double charge",
)

TASK_COLUMNS: Final = (
    "id", "tenant_id", "client_task_id", "registration_hash", "workflow_key",
    "workflow_version", "contract_key", "contract_version", "object_type",
    "object_id", "object_version", "state", "state_version", "current_step",
    "wake_at", "reason_code", "lease_owner", "lease_token", "lease_acquired_at",
    "lease_expires_at", "trace_id", "span_id", "created_at", "updated_at",
)  # fmt: skip
OPERATION_COLUMNS: Final = (
    "id", "tenant_id", "task_id", "idempotency_key", "action", "target",
    "input_hash", "input", "agent_id", "executed_by_agent_id", "call_fields",
    "state", "state_version",
    "reason_code", "attempts", "lookups", "next_check_at", "provider_reference",
    "result", "trace_id", "span_id", "created_at", "updated_at",
)  # fmt: skip
CREDENTIAL_COLUMNS: Final = (
    "id", "tenant_id", "operation_id", "object_type", "object_id", "fields",
    "action", "target", "secret_hash", "issued_at", "expires_at",
)  # fmt: skip
ESCALATION_COLUMNS: Final = (
    "id", "tenant_id", "task_id", "operation_id", "reason_code", "evidence",
    "responsible_owner", "created_at", "resolved_at", "resolved_by_id", "resolution",
)  # fmt: skip
EVENT_COLUMNS: Final = (
    "id", "tenant_id", "task_id", "operation_id", "code", "actor_type", "actor_id",
    "reason_code", "contract_key", "contract_version", "payload", "trace_id",
    "span_id", "created_at", "chain_seq", "prev_hash", "hash",
)  # fmt: skip
OUTBOX_COLUMNS: Final = (
    "id", "tenant_id", "event_id", "topic", "key", "payload", "state", "attempts",
    "available_at", "sent_at", "last_error", "created_at",
)  # fmt: skip
# Parents before children: the composite foreign keys are checked row by row.
TABLES: Final = (
    ("tasks_task", TASK_COLUMNS),
    ("tasks_operation", OPERATION_COLUMNS),
    ("tasks_credential", CREDENTIAL_COLUMNS),
    ("tasks_escalation", ESCALATION_COLUMNS),
    ("audit_event", EVENT_COLUMNS),
    ("audit_outbox", OUTBOX_COLUMNS),
)

Row = tuple[Any, ...]


# Payloads as stored (jsonb takes any JSON text); hashes go through the portal's own
# RFC 8785 code (audit.chain, tasks.hashing), so a load verifies like live rows.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _dumps(value: Any) -> str:
    return _JSON.encode(value)


def _quoted(value: str | None) -> str:
    """A JSON string or null, for ids and codes (no characters to escape)."""
    return "null" if value is None else f'"{value}"'


def _iso(at: dt.datetime) -> str:
    return at.isoformat()


class _Ids:
    """UUIDv7 text made from a given time (RFC 9562), random bits from the seed."""

    def __init__(self, rng: random.Random) -> None:
        self._bits = rng.getrandbits

    def at(self, at: dt.datetime) -> str:
        ms = int(at.timestamp() * 1000)
        rand = self._bits(74)
        value = (
            (ms & 0xFFFF_FFFF_FFFF) << 80
            | 0x7 << 76
            | (rand >> 62) << 64
            | 0b10 << 62
            | (rand & 0x3FFF_FFFF_FFFF_FFFF)
        )
        h = f"{value:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def hex(self, digits: int) -> str:
        return f"{self._bits(digits * 4):0{digits}x}"


@dataclass(frozen=True, kw_only=True)
class TenantSetUp:
    """One tenant's people, agents and pinned contract, as the loader uses them."""

    id: str
    slug: str
    agents: tuple[tuple[str, str], ...]  # (id, name)
    support_user_ids: tuple[int, ...]
    contract_version: int


@dataclass(kw_only=True)
class Chunk:
    """The rows of one chunk of tasks, per table, in ``TABLES`` order."""

    rows: dict[str, list[Row]] = field(
        default_factory=lambda: {name: [] for name, _ in TABLES}
    )
    events: int = 0

    def add(self, table: str, row: Row) -> None:
        self.rows[table].append(row)


@dataclass(kw_only=True)
class LoadSummary:
    tasks: int = 0
    events: int = 0
    outbox: int = 0
    operations: int = 0
    escalations: int = 0
    credentials: int = 0
    seconds: float = 0.0


class Progress:
    """A progress line on stderr: count, share, rate and time left.

    On a terminal the line is redrawn in place (at most 4 times a second); in a log
    file a new line is written every ``log_every_s`` seconds, and at the end.
    """

    def __init__(
        self,
        *,
        total: int,
        unit: str,
        write: Callable[[str], object],
        tty: bool,
        log_every_s: float = 5.0,
    ) -> None:
        self.total = max(total, 1)
        self.unit = unit
        self.write = write
        self.tty = tty
        self.done = 0
        self.started = time.monotonic()
        self._last = 0.0
        self._every = 0.25 if tty else log_every_s

    def advance(self, count: int, *, final: bool = False) -> None:
        self.done += count
        now = time.monotonic()
        if not final and now - self._last < self._every:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else math.inf
        eta = "--" if math.isinf(left) else _duration(left)
        line = (
            f"load_scale_data: {self.done:,}/{self.total:,} {self.unit} "
            f"({100 * self.done / self.total:5.1f} %), {rate:,.0f} {self.unit}/s, "
            f"elapsed {_duration(elapsed)}, ETA {eta}"
        )
        if self.tty:
            self.write("\r" + line + ("\n" if final else ""))
        else:
            self.write(line + "\n")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


# --- Tenants, people, agents: through the services ---------------------------------


def tenants_set_up(
    *, count: int, report: Callable[[str], None]
) -> tuple[list[TenantSetUp], list[float]]:
    """Create (or find) the ``scale-tNN`` tenants with their people and agents.

    Returns the tenants and their weights (tenant *n*: 1/n). Running it again
    changes nothing but the users' passwords, which are reset to ``PASSWORD``.
    """
    made: list[TenantSetUp] = []
    # One hash for every user: PBKDF2 is slow by design, and these are test logins.
    password_hash = make_password(PASSWORD)
    for n in range(1, count + 1):
        slug = f"scale-t{n:02d}"
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            tenant = services.tenant_create(slug=slug, name=f"Scale tenant {n:02d}")
        with scope.tenant_scope([tenant.pk]):  # row-level security: this tenant
            made.append(_tenant_set_up(tenant=tenant, n=n, password_hash=password_hash))
    report(
        f"{count} tenants scale-t01..scale-t{count:02d}; users reviewer-tNN, "
        f"support-tNN, admin-tNN (password {PASSWORD!r})"
    )
    return made, [1 / n for n in range(1, count + 1)]


def _tenant_set_up(*, tenant: Tenant, n: int, password_hash: str) -> TenantSetUp:
    """One tenant's people, agents, contract and connector."""
    slug = tenant.slug
    support_ids = []
    for prefix, role in ROLES:
        user, _ = get_user_model().objects.get_or_create(username=f"{prefix}-t{n:02d}")
        user.is_staff = True
        user.is_superuser = False
        user.password = password_hash
        user.save()
        services.membership_grant(tenant=tenant, user=user, role=role)
        if role == Role.SUPPORT:
            support_ids.append(user.pk)
    agents = []
    for a in range(1, AGENTS_PER_TENANT + 1):
        name = f"agent-t{n:02d}-{a}"
        agent = Agent.objects.filter(tenant=tenant, name=name).first()
        if agent is None:
            agent = services.agent_create(tenant=tenant, name=name)
        services.agent_grant(agent=agent, action=ACTION, target=TARGET)
        agents.append((str(agent.pk), name))
    contract = (
        Contract.objects.filter(tenant=tenant, key=CONTRACT_KEY)
        .order_by("-version")
        .first()
    )
    if contract is None:
        contract = task_services.contract_create(
            tenant=tenant, key=CONTRACT_KEY, spec=CONTRACT_SPEC, publish=True
        )
    if not Connector.objects.filter(tenant=tenant, target=TARGET).exists():
        task_services.connector_save(
            tenant=tenant,
            target=TARGET,
            values={"base_url": "http://127.0.0.1:8100"},
        )
    return TenantSetUp(
        id=str(tenant.pk),
        slug=slug,
        agents=tuple(agents),
        support_user_ids=tuple(support_ids),
        contract_version=contract.version,
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
    ids: _Ids
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
        payload = _dumps(data)
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
            f'"operation_id":{_quoted(operation_id)},"reason_code":{_quoted(reason)},'
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
    ids: _Ids,
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
            story.tick(60_000, 120_000)
            story.event(
                "task.lease_expired",
                {"from": "running", "to": "pending", "lease_token": story.lease_token},
                actor=("system", "lease-reaper"),
                reason="LEASE_EXPIRED",
                operation=False,
                moves_task=True,
            )
        else:
            transitioned("waiting", step="await-crm")
            story.tick(30_000, 600_000)
            story.event(
                "task.woken",
                {"from": "waiting", "to": "pending"},
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
            },
        )  # fmt: skip
        if "receipt.queried" in extras:
            lookups = 1
            story.event(
                "receipt.queried",
                {
                    "outcome": "found", "receipts": [provider_reference], "count": 1,
                    "purpose": "confirm",
                },
            )  # fmt: skip
        if via_person:
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
        story.tick(60_000, 120_000)
        story.event(
            "task.lease_expired",
            {"from": "running", "to": "pending", "lease_token": story.lease_token},
            actor=("system", "lease-reaper"),
            reason="LEASE_EXPIRED",
            operation=False,
            moves_task=True,
        )
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
            digest, _dumps(operation_input), agent_id, agent_id if calls else None,
            _dumps({"email": "c***@example.com"}) if calls else None,
            operation_state, OPERATION_VERSIONS[operation_state] + 2 * via_person,
            operation_reason, attempts, lookups, next_check_at, provider_reference,
            _dumps({"ticket_id": provider_reference}) if calls else None,
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
                object_id, _dumps(fields), ACTION, TARGET, story.ids.hex(64), at,
                expires_at,
            ),
        )  # fmt: skip
        issued.append(
            {
                "credential_id": credential_id, "use": use, "action": ACTION,
                "target": TARGET, "fields": fields, "expires_at": _iso(expires_at),
                "ttl_s": ttl_s,
            }
        )  # fmt: skip
    story.at -= dt.timedelta(milliseconds=5)  # the event lands on the issue time
    return issued


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
            _dumps(evidence), owner, at, None, None, "",
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
        {"outcome": "none", "receipts": [], "count": 0, "purpose": "recover"},
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


# --- The load ------------------------------------------------------------------------


def _counts() -> tuple[int, int]:
    """Tasks and events in the whole database: every tenant's, whatever the scope
    (a command starts with none, which would count nothing)."""
    with scope.every_tenant(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM tasks_task),"
            " (SELECT count(*) FROM audit_event)"
        )
        tasks, events = cursor.fetchone()
    return int(tasks), int(events)


def _created_at(
    rng: random.Random, *, state: str, slot: int, slots: int, now: dt.datetime
) -> dt.datetime:
    """When the task was registered.

    Finished tasks in time order over 90 days. Unfinished ones over the time they
    plausibly stay unfinished: running within the hour (their leases are live),
    pending within two days, waiting within a week, escalations within two weeks;
    so the last day holds about twice the average day's events, not a burst.
    """
    recent = {
        "running": 3600,
        "pending": 2 * 86400,
        "waiting": 7 * 86400,
        "human_required": 14 * 86400,
        "human_claimed": 14 * 86400,
    }.get(state)
    if recent is not None:
        return now - dt.timedelta(seconds=rng.uniform(60, recent))
    offset = (slot + rng.random()) * (HISTORY.total_seconds() - 60) / slots
    return now - HISTORY + dt.timedelta(seconds=offset)


@functools.cache
def _row_level_secured() -> frozenset[str]:
    """The loaded tables under row-level security, which refuses ``COPY FROM``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relrowsecurity AND relname = ANY(%s)",
            [[table for table, _ in TABLES]],
        )
        return frozenset(name for (name,) in cursor.fetchall())


def _copy(chunk: Chunk) -> None:
    """COPY the chunk's rows, parents first, in the caller's transaction.

    A table under row-level security is copied into a temporary table first and
    inserted from there, so its policy checks every row (tenant scope of ``load``).
    """
    secured = _row_level_secured()
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg cursor under Django's wrapper
        for table, columns in TABLES:
            rows = chunk.rows[table]
            if not rows:
                continue
            names = ", ".join(columns)
            target = table
            if table in secured:
                target = f"load_{table}"
                raw.execute(
                    f"CREATE TEMP TABLE IF NOT EXISTS {target} "
                    f"(LIKE {table}) ON COMMIT DELETE ROWS"
                )
            # Same-tenant children need their parent rows first: one table at a
            # time keeps every composite foreign key satisfied row by row.
            with raw.copy(f"COPY {target} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            if target != table:
                raw.execute(
                    f"INSERT INTO {table} ({names}) SELECT {names} FROM {target}"
                )


def load(
    *,
    tasks: int,
    events: int,
    tenants: int,
    outbox: int | None = None,
    seed: int = 8,
    append: bool = False,
    report: Callable[[str], None] = lambda line: None,
    progress: Callable[[str], object] = sys.stderr.write,
    progress_tty: bool = False,
    chunk_tasks: int = CHUNK_TASKS,
    writers: int = 2,
) -> LoadSummary:
    """Load tasks and their stories until the database holds ``tasks``/``events``.

    With ``append``, add that many on top instead. Each chunk of tasks (with all
    its rows) commits on its own; with ``writers`` > 0 the chunks are written by
    that many threads on connections of their own, so they do not join the
    caller's transaction (a test that wants them rolled back passes
    ``writers=0``).

    Raises:
        CommandError: production settings; the database already holds that many
            rows (without ``append``); counts that cannot give 5-15 events a task.
    """
    if settings.PRODUCTION:
        raise CommandError(
            "load_scale_data makes users with published passwords; it refuses to "
            "run with production settings."
        )
    if tasks < 1 or tenants < 1:
        raise CommandError("--tasks and --tenants must be at least 1.")
    have_tasks, have_events = _counts()
    if not append and (have_tasks >= tasks or have_events >= events):
        raise CommandError(
            f"the database already holds {have_tasks:,} tasks and {have_events:,} "
            f"events (asked for {tasks:,} and {events:,}); nothing loaded. Pass "
            "--append to add that many more."
        )
    set_up, weights = tenants_set_up(count=tenants, report=report)
    # Row-level security: the chunks write the tenants just set up, on this thread
    # and on the writers' (whose context starts empty).
    in_scope = [t.id for t in set_up]

    def commit_in_scope(chunk: Chunk) -> None:
        with scope.tenant_scope(in_scope):
            commit(chunk)

    have_tasks, have_events = _counts()  # the set-up wrote events of its own
    new_tasks = tasks if append else tasks - have_tasks
    new_events = events if append else events - have_events
    if not (
        MIN_EVENTS_PER_TASK * new_tasks <= new_events <= MAX_EVENTS_PER_TASK * new_tasks
    ):
        raise CommandError(
            f"{new_events:,} events for {new_tasks:,} tasks: each task gets "
            f"{MIN_EVENTS_PER_TASK}-{MAX_EVENTS_PER_TASK} events."
        )
    # Published events are about 70 % of all; keep about ``outbox`` of them.
    share = 1.0 if outbox is None else min(1.0, outbox / (0.7 * new_events))
    report(
        f"loading {new_tasks:,} tasks and {new_events:,} events over {tenants} "
        f"tenants (seed {seed}, chunks of {chunk_tasks:,} tasks)"
    )
    # Reproducible test data, not secrets: the seed makes the same data set again
    # in an empty database; a top-up or an append draws fresh ids.
    rng = random.Random(f"{seed}:{have_tasks}")  # noqa: S311
    ids = _Ids(rng)
    now = dt.datetime.now(dt.UTC)
    states = [name for name, _ in STATE_MIX]
    state_weights = [weight for _, weight in STATE_MIX]
    summary = LoadSummary()
    bar = Progress(total=new_events, unit="events", write=progress, tty=progress_tty)
    started = time.monotonic()

    def chunks() -> Iterator[Chunk]:
        remaining_events = new_events
        done = 0
        while done < new_tasks:
            chunk = Chunk()
            size = min(chunk_tasks, new_tasks - done)
            chosen_tenants = rng.choices(set_up, weights, k=size)
            chosen_states = rng.choices(states, state_weights, k=size)
            for offset in range(size):
                count = event_count(
                    rng,
                    remaining_events=remaining_events,
                    remaining_tasks=new_tasks - done - offset,
                )
                remaining_events -= count
                state = chosen_states[offset]
                task_story(
                    chunk=chunk,
                    rng=rng,
                    ids=ids,
                    tenant=chosen_tenants[offset],
                    index=have_tasks + done + offset,
                    state=state,
                    events=count,
                    created_at=_created_at(
                        rng, state=state, slot=done + offset, slots=new_tasks, now=now
                    ),
                    outbox_share=share,
                )
                chunk.events += count
            done += size
            yield chunk

    counted = threading.Lock()

    def commit(chunk: Chunk) -> None:
        with transaction.atomic():
            _copy(chunk)
        with counted:
            summary.tasks += len(chunk.rows["tasks_task"])
            summary.events += chunk.events
            summary.outbox += len(chunk.rows["audit_outbox"])
            summary.operations += len(chunk.rows["tasks_operation"])
            summary.escalations += len(chunk.rows["tasks_escalation"])
            summary.credentials += len(chunk.rows["tasks_credential"])
            bar.advance(chunk.events, final=summary.tasks >= new_tasks)

    next_analyze = 1

    def analyze_when_grown() -> None:
        # After the first chunk and whenever the load has doubled since.
        nonlocal next_analyze
        if summary.tasks >= next_analyze:
            _analyze()
            next_analyze = 2 * summary.tasks

    if writers < 1:
        for chunk in chunks():
            commit_in_scope(chunk)
            analyze_when_grown()
    else:
        # Build chunks here while ``writers`` threads COPY earlier ones, each on
        # its own connection and in its own transactions: the server's work
        # (indexes, foreign keys) is most of the cost, and a second backend uses
        # the second core.
        with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="copy") as pool:
            in_flight: deque[Future[None]] = deque()
            try:
                for chunk in chunks():
                    if len(in_flight) >= writers:
                        in_flight.popleft().result()
                    analyze_when_grown()
                    in_flight.append(pool.submit(commit_in_scope, chunk))
                while in_flight:
                    in_flight.popleft().result()
            finally:
                for running in in_flight:
                    running.cancel()
                # One close per thread, each in the thread that owns the
                # connection (the barrier keeps a thread from taking two).
                barrier = threading.Barrier(writers)

                def close_own() -> None:
                    barrier.wait(timeout=120)
                    connection.close()

                closing = [pool.submit(close_own) for _ in range(writers)]
                for closed in closing:
                    closed.result()
    summary.seconds = time.monotonic() - started
    _analyze()
    return summary


def _analyze() -> None:
    """Fresh statistics for the loaded tables.

    Not only for the pages afterwards: every foreign-key check is a cached plan,
    and planned against a table the statistics call empty it is a sequential scan,
    which makes each COPY slower the more rows are in (with autovacuum off, nothing
    else analyses them). ANALYZE invalidates those plans.
    """
    with connection.cursor() as cursor:
        for table, _ in TABLES:
            cursor.execute(f"ANALYZE {table}")


class Command(BaseCommand):
    help = (
        "Load a realistic data set (tenants, people, agents, tasks, operations, "
        "escalations, events, outbox) through COPY, for performance work "
        "(development only)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=int, default=1_000_000)
        parser.add_argument("--events", type=int, default=10_000_000)
        parser.add_argument("--tenants", type=int, default=20)
        parser.add_argument(
            "--outbox",
            type=int,
            default=None,
            help="about how many outbox rows (default: one per published event)",
        )
        parser.add_argument("--seed", type=int, default=8)
        parser.add_argument(
            "--append",
            action="store_true",
            help="add --tasks/--events on top of what the database holds",
        )
        parser.add_argument(
            "--chunk", type=int, default=CHUNK_TASKS, help="tasks per transaction"
        )
        parser.add_argument(
            "--writers",
            type=int,
            default=2,
            help="threads that COPY, each on its own connection (default: 2; "
            "0 writes in the calling thread)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # The set-up's events need no live relay (beat finds pending rows anyway);
        # without a broker each nudge would only wait for a timeout.
        settings.PORTAL_RELAY_NUDGE = False
        summary = load(
            tasks=options["tasks"],
            events=options["events"],
            tenants=options["tenants"],
            outbox=options["outbox"],
            seed=options["seed"],
            append=options["append"],
            report=lambda line: self.stdout.write(f"load_scale_data: {line}"),
            progress=lambda text: self.stderr.write(text, ending=""),
            progress_tty=self.stderr.isatty(),
            chunk_tasks=options["chunk"],
            writers=options["writers"],
        )
        rate = summary.events / summary.seconds if summary.seconds else 0.0
        self.stdout.write(
            f"load_scale_data: loaded {summary.tasks:,} tasks, "
            f"{summary.operations:,} operations, {summary.credentials:,} credentials, "
            f"{summary.escalations:,} escalations, {summary.events:,} events and "
            f"{summary.outbox:,} outbox rows in {_duration(summary.seconds)} "
            f"({rate:,.0f} events/s)"
        )
