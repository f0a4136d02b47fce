"""What the loader writes: its sizes and mixes, the tables and columns it COPYs,
and the helpers that make a row (UUIDv7 ids at a given time, JSON text)."""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass, field
from typing import Any, Final

from config.management.commands import seed_demo
from portal.models import Role
from tasks.gateway import checks as gateway_checks

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
    "action", "target", "secret_hash", "issued_at", "expires_at", "revoked_at",
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


def dumps(value: Any) -> str:
    return _JSON.encode(value)


def quoted(value: str | None) -> str:
    """A JSON string or null, for ids and codes (no characters to escape)."""
    return "null" if value is None else f'"{value}"'


def iso(at: dt.datetime) -> str:
    return at.isoformat()


class Ids:
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
