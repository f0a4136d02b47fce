"""The measured operations, each as service layer, raw psycopg and (one) plain ORM.

Import after ``django.setup()``. The raw flavour executes the very statements the
services execute (their module constants, checked by ``check_same_statements``) with
the same parameters, in the same BEGIN ... COMMIT, over a plain psycopg 3 connection:
what it leaves out (argument checks, redaction, model building, Django's cursor and
transaction machinery) is the overhead being measured.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models import DateTimeField, F, Func
from django.db.models.functions import Now

from audit import services as audit_services
from audit.models import EventCode, Outbox
from audit.redaction import json_dumps, redact
from portal import scope
from portal import selectors as portal_selectors
from portal.actors import Actor, ActorType
from portal.exceptions import IllegalTransition, StaleState
from portal.ids import new_id
from portal.models import Agent, AgentGrant, Tenant
from tasks import services, task_state
from tasks.models import TASK_TRANSITIONS, Task, TaskState
from tasks.services import operations as operation_services
from tasks.services import tasks as task_services

from .spec import WHAT_IFS, RunSpec, WhatIf

EVENT_AND_OUTBOX: Final = audit_services._INSERT_TASK_EVENT_AND_OUTBOX
TRANSITION: Final = task_services._TRANSITION_AND_EVENT
RESERVE: Final = operation_services._RESERVE
CLAIM_NEXT: Final = task_services._CLAIM_NEXT.sql

# What one measured operation executes, in order; the service must match (see below).
# GRANT_CHECK stands for the read of ``portal.selectors.agent_may`` (the API's
# coordinator labels it by the text ``grant_check`` captures).
GRANT_CHECK: Final = "<agent_may>"
# The reservation's read before its insert: the agent's grant, freeze flags and
# limits, the contract spec, the policy set in force.
RESERVE_CONTEXT: Final = operation_services._RESERVE_CONTEXT_OF_AGENT
STATEMENTS: Final[dict[str, tuple[str, ...]]] = {
    "transition": (TRANSITION,),
    "reservation": (RESERVE_CONTEXT, RESERVE, EVENT_AND_OUTBOX),
    "claim": (CLAIM_NEXT, EVENT_AND_OUTBOX, TRANSITION),
}

# Columns of ``RETURNING old.state, <task columns>`` and ``RETURNING <task columns>``.
_ATTNAMES: Final = task_state.TASK_ATTNAMES
_OP_ATTNAMES: Final = operation_services.OPERATION_ATTNAMES
_TASK_ID = _ATTNAMES.index("id")
_STATE_VERSION = _ATTNAMES.index("state_version")
_LEASE_TOKEN = _ATTNAMES.index("lease_token")
_OPERATION_ID = _OP_ATTNAMES.index("id")

LEASE_TTL: Final = dt.timedelta(seconds=settings.PORTAL_DEFAULT_LEASE_SECONDS)
POOL_LEASE: Final = dt.timedelta(hours=2)
RESERVATION_ACTION: Final = "create_ticket"
RESERVATION_TARGET: Final = "ticket-desk"
RESERVATION_INPUT: Final[dict[str, Any]] = {
    "title": "Printer on fire",
    "priority": 2,
    "customer": {"id": "c-42", "tier": "gold"},
}


class PoolEmpty(Exception):
    """The client used up its prepared tasks; refill (untimed) and go on."""


class SqlCursor(Protocol):
    """A psycopg cursor, or Django's wrapper of one."""

    def execute(self, sql: str, params: Any = ...) -> Any: ...

    def fetchone(self) -> Any: ...


class Runner(Protocol):
    def op(self) -> None: ...

    def refill(self) -> None: ...


def connection_options() -> str:
    """The libpq ``options`` Django connects with (lock and statement timeouts)."""
    options: str = settings.DATABASES["default"]["OPTIONS"]["options"]
    return options


def connect_raw(database_url: str) -> psycopg.Connection[Any]:
    """A plain psycopg 3 connection with psycopg's defaults and Django's options."""
    return psycopg.connect(database_url, autocommit=True, options=connection_options())


def raw_scope(conn: psycopg.Connection[Any], tenant_id: uuid.UUID | str) -> None:
    """Row-level security: the raw flavour sees its tenant's rows through a
    session-wide scope, set once per run, so it pays the policies but not the
    per-transaction ``set_config`` the services pay (docs/database-roles.md)."""
    conn.execute("SELECT set_config('portal.tenant_ids', %s, false)", [str(tenant_id)])


def connect_raw_like_django(database_url: str) -> psycopg.Connection[Any]:
    """Psycopg as Django sets it up: client-side binding, no prepared statements."""
    return psycopg.connect(
        database_url,
        autocommit=True,
        options=connection_options(),
        cursor_factory=psycopg.ClientCursor,
        prepare_threshold=None,
    )


_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a local PostgreSQL backend, else 0.

    A remote server's backend id may name an unrelated local process: only a process
    called ``postgres`` counts.
    """
    proc = Path(f"/proc/{pid}")
    try:
        if proc.joinpath("comm").read_text().strip() != "postgres":
            return 0.0
        fields = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


# --- Setup ---------------------------------------------------------------------------

_TASK_COLUMNS = """
    id, tenant_id, client_task_id, registration_hash, workflow_key, workflow_version,
    object_type, object_id, object_version, state, state_version, current_step,
    lease_owner, lease_token, lease_acquired_at, lease_expires_at, trace_id, span_id,
    created_at, updated_at
"""
# COPY FROM refuses a table under row-level security: copy into a temporary twin,
# then one INSERT … SELECT, which the policy checks (the raw scope: ``raw_scope``).
_COPY_TASKS_STAGE = """
CREATE TEMPORARY TABLE IF NOT EXISTS bench_task_stage
    (LIKE tasks_task INCLUDING DEFAULTS) ON COMMIT DELETE ROWS
"""
_COPY_TASKS = f"COPY bench_task_stage ({_TASK_COLUMNS}) FROM STDIN"
_INSERT_STAGED_TASKS = (
    f"INSERT INTO tasks_task ({_TASK_COLUMNS}) SELECT {_TASK_COLUMNS}"
    " FROM bench_task_stage"
)
# A registered task's chain has begun: registration appended its first event, which
# made the chain's head row (event_append). Without the row every measured transition
# would pay for starting a chain, which no transition does in use. Made at 0, with no
# hash: the chain's next event is #1, after GENESIS.
_START_STAGED_CHAINS = (
    "INSERT INTO audit_chainhead (tenant_id, task_id, head_seq)"
    " SELECT tenant_id, id, 0 FROM bench_task_stage"
)
# Registration times one microsecond apart, as if registered one by one: claim_next
# orders by (created_at, id) over an index on created_at, and one shared timestamp
# would make every claim sort the whole queue.
_REGISTRATION_GAP: Final = dt.timedelta(microseconds=1)


def insert_tasks(
    conn: psycopg.Connection[Any],
    *,
    tenant_id: uuid.UUID,
    count: int,
    owner: str | None,
) -> list[uuid.UUID]:
    """Insert ``count`` tasks: running and leased to ``owner`` (token 1), or pending."""
    now = dt.datetime.now(dt.UTC)
    leased = owner is not None
    ids = [new_id() for _ in range(count)]
    state = TaskState.RUNNING.value if leased else TaskState.PENDING.value
    lease = (owner, 1, now, now + POOL_LEASE) if leased else (None, 0, None, None)
    with conn.transaction(), conn.cursor() as cursor:
        cursor.execute(_COPY_TASKS_STAGE)
        with cursor.copy(_COPY_TASKS) as copy:
            for number, task_id in enumerate(ids):
                text_id = str(task_id)
                created_at = now + number * _REGISTRATION_GAP
                copy.write_row(
                    [
                        task_id, tenant_id, text_id, "0" * 64, "bench", "1",
                        "bench_object", text_id, "1", state, 1, "", *lease, "", "",
                        created_at, created_at,
                    ]
                )  # fmt: skip
        cursor.execute(_INSERT_STAGED_TASKS)
        cursor.execute(_START_STAGED_CHAINS)
    return ids


def leased_pool(
    conn: psycopg.Connection[Any], *, tenant_id: uuid.UUID, owner: str
) -> list[uuid.UUID]:
    rows = conn.execute(
        "SELECT id FROM tasks_task WHERE tenant_id = %s AND lease_owner = %s"
        " AND state = 'running' ORDER BY id DESC",
        [tenant_id, owner],
    ).fetchall()
    return [row[0] for row in rows]


def owner_of(index: int) -> str:
    return f"bench-w{index}"


def peer_application_name(index: int) -> str:
    """The ``application_name`` of client ``index``'s connections to a peer."""
    return f"bench-peer-{index}"


def make_tenant(slug: str) -> tuple[Tenant, Agent]:
    """A tenant and its agent, granted the reservation's action on any target."""
    tenant = Tenant.objects.create(slug=slug, name=slug)
    with scope.tenant_scope([tenant.pk]):
        agent = Agent.objects.create(tenant=tenant, name="bench-agent")
        AgentGrant.objects.create(
            tenant=tenant, agent=agent, action=RESERVATION_ACTION, target="*"
        )
    return tenant, agent


def grant_check(*, tenant: Tenant, agent_id: str) -> tuple[str, Any]:
    """The SQL and parameters of the grant read ``operation_reserve`` makes."""
    with captured_statements() as seen:
        granted = portal_selectors.agent_may(
            tenant=tenant,
            agent_id=agent_id,
            action=RESERVATION_ACTION,
            target=RESERVATION_TARGET,
        )
    if not granted or len(seen) != 1:
        raise AssertionError(f"agent_may: granted={granted}, {len(seen)} statements")
    sql, params = seen[0]
    return sql, params


# --- Raw psycopg ---------------------------------------------------------------------


def _event_params(
    *,
    tenant_id: uuid.UUID,
    code: str,
    actor: Actor,
    task_id: uuid.UUID,
    payload: Mapping[str, Any],
    operation_id: uuid.UUID | None = None,
) -> dict[str, Any]:
    """Parameters of ``EVENT_AND_OUTBOX``, shaped as ``event_append`` shapes them."""
    event_id = new_id()
    envelope = {
        "schema_version": audit_services.ENVELOPE_SCHEMA_VERSION,
        "event_id": str(event_id),
        "code": code,
        "tenant_id": str(tenant_id),
        "task_id": str(task_id),
        "operation_id": str(operation_id) if operation_id else None,
        "reason_code": None,
        "data": payload,
        "trace_id": "",
    }
    return {
        **audit_services.event_params(
            event_id=event_id,
            tenant_id=tenant_id,
            task_id=task_id,
            operation_id=operation_id,
            code=code,
            actor_type=actor.type,
            actor_id=actor.id,
            reason_code=None,
            contract_key=None,
            contract_version=None,
            payload=payload,
            trace_id="",
            span_id="",
        ),
        "outbox_id": new_id(),
        "key": str(event_id),
        "envelope": json_dumps(envelope),
    }


def raw_transition(
    cursor: SqlCursor,
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    to: str,
    expected_version: int,
    lease_token: int,
    actor: Actor,
) -> None:
    """``task_transition``'s one statement; the caller holds the transaction."""
    event = audit_services.slotted_event_params(
        tenant_id=tenant_id,
        code=EventCode.TASK_TRANSITIONED,
        actor=actor,
        task_id=task_id,
        payload={
            "to": to,
            "state_version": expected_version + 1,
            "lease_token": lease_token,
            "data": {},
        },
        slots=task_services._TRANSITION_SLOTS,
    )
    assert event is not None
    cursor.execute(
        TRANSITION,
        {
            "_blank_step_only": False,
            **task_services._TRANSITION_IN_ONE.params(
                moves=task_state.task_moves_to(to),
                params={
                    "reason": None,
                    "step": None,
                    "wake_at": None,
                    "keep_lease": to == TaskState.RUNNING,
                    "tenant_id": tenant_id,
                    "task_id": task_id,
                    "expected_version": expected_version,
                    "lease_token": lease_token,
                },
            ),
            **event,
        },
    )
    row = cursor.fetchone()
    if row is None or not row[0]:
        raise RuntimeError(f"raw transition of {task_id} wrote no event")


# As long as tasks/sealed.py's seal of RESERVATION_INPUT: "v1:" and the base64 of a
# 12-byte nonce, the JSON of {"input": …} and a 16-byte tag (155 characters).
_RAW_SEALED = "v1:" + "A" * 152


def raw_reserve(
    cursor: SqlCursor,
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    lease_token: int,
    idempotency_key: str,
    action: str,
    target: str,
    input: Any,
    actor: Actor,
) -> None:
    """``operation_reserve``'s three statements (new key); the caller holds the txn.

    First the tenant scope, as the service's transaction sets it (row-level
    security on the grants, docs/database-roles.md).
    """
    cursor.execute("SELECT set_config(%s, %s, true)", [scope.SETTING, str(tenant_id)])
    cursor.execute(
        RESERVE_CONTEXT,
        {
            "tenant_id": tenant_id,
            "task_id": task_id,
            "agent_id": uuid.UUID(actor.id),
            "action": action,
            "target": target,
            "published": "published",
        },
    )
    context = cursor.fetchone()
    if context is None or not context[0]:
        raise RuntimeError("raw reservation: no grant")
    # Sorted compact JSON is RFC 8785 for this input (ASCII keys, small integers).
    digest = hashlib.sha256(
        json.dumps(input, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    cursor.execute(
        RESERVE,
        {
            "tenant_id": tenant_id,
            "task_id": task_id,
            "lease_token": lease_token,
            "id": new_id(),
            "key": idempotency_key,
            "action": action,
            "target": target,
            "input_hash": digest,
            "input": json_dumps(input),
            # The row stores what the service stores; encrypting it is the service's
            # CPU, not the database's, so raw writes a sealed value of the same size.
            "sealed": _RAW_SEALED,
            "agent_id": actor.id,
            "trace_id": "",
            "span_id": "",
        },
    )
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError(f"raw reservation {idempotency_key} touched no row")
    cursor.execute(
        EVENT_AND_OUTBOX,
        _event_params(
            tenant_id=tenant_id,
            code=EventCode.OPERATION_RESERVED,
            actor=actor,
            task_id=task_id,
            operation_id=row[_OPERATION_ID],
            payload={
                "idempotency_key": idempotency_key,
                "action": action,
                "target": target,
                "input_hash": digest,
                "lease_token": lease_token,
            },
        ),
    )


def raw_claim(
    cursor: SqlCursor, *, tenant_id: uuid.UUID, owner: str, actor: Actor
) -> tuple[uuid.UUID, int, int] | None:
    """``task_claim_next``'s two statements: (task id, state version, lease token)."""
    cursor.execute(
        CLAIM_NEXT,
        task_services._CLAIM_NEXT.params(
            moves=task_services._CLAIM_NEXT_MOVES,
            params={
                "tenant_id": tenant_id,
                "agent_id": uuid.UUID(actor.id),
                "owner": owner,
                "ttl": LEASE_TTL,
            },
        ),
    )
    row = cursor.fetchone()
    if row is None:
        return None
    task_id, lease_token = row[_TASK_ID], row[_LEASE_TOKEN]
    state_version = row[_STATE_VERSION]
    cursor.execute(
        EVENT_AND_OUTBOX,
        _event_params(
            tenant_id=tenant_id,
            code=EventCode.TASK_CLAIMED,
            actor=actor,
            task_id=task_id,
            payload={
                "from": TaskState.PENDING.value,
                "to": TaskState.RUNNING.value,
                "owner": owner,
                "lease_token": lease_token,
                "state_version": state_version,
            },
        ),
    )
    return task_id, state_version, lease_token


# --- Plain ORM (reference only) ------------------------------------------------------

_APP_NOW = Func(function="app_now", template="app_now()", output_field=DateTimeField())


@transaction.atomic(durable=True)
def orm_task_transition(
    *,
    tenant: Tenant,
    task_id: uuid.UUID,
    to: str,
    expected_version: int,
    lease_token: int,
    actor: Actor,
) -> Task:
    """docs/style.md R4's readable ORM form of ``task_transition``, same guarantees.

    Five statements: read, guarded update, event, outbox row, read back.
    """
    task = Task.objects.get(tenant=tenant, pk=task_id)
    if (task.state, to) not in TASK_TRANSITIONS:
        raise IllegalTransition(current=task.state, requested=to)
    keep_lease = to == TaskState.RUNNING
    moved = Task.objects.filter(
        tenant=tenant,
        pk=task_id,
        state_version=expected_version,
        lease_token=lease_token,
        lease_owner__isnull=False,
        lease_expires_at__gt=_APP_NOW,
    ).update(
        state=to,
        state_version=F("state_version") + 1,
        reason_code=None,
        wake_at=None,
        updated_at=Now(),
        lease_owner=F("lease_owner") if keep_lease else None,
        lease_acquired_at=F("lease_acquired_at") if keep_lease else None,
        lease_expires_at=F("lease_expires_at") if keep_lease else None,
    )
    if not moved:
        raise StaleState(task_id=str(task_id), expected_state_version=expected_version)
    payload = redact(
        {
            "from": task.state,
            "to": to,
            "state_version": expected_version + 1,
            "step": task.current_step,
            "lease_token": lease_token,
            "data": {},
        },
        tenant_id=tenant.pk,
    )
    # The event through event_append (without its outbox row): the hash chain is
    # computed in its INSERT, which Event.objects.create() cannot do.
    event_id = audit_services.event_append(
        tenant_id=tenant.pk,
        task_id=task_id,
        code=EventCode.TASK_TRANSITIONED,
        actor=actor,
        data=payload,
        publish=False,
    )
    Outbox.objects.create(
        tenant=tenant,
        event_id=event_id,
        topic=EventCode.TASK_TRANSITIONED,
        key=str(event_id),
        payload={
            "schema_version": audit_services.ENVELOPE_SCHEMA_VERSION,
            "event_id": str(event_id),
            "code": EventCode.TASK_TRANSITIONED,
            "tenant_id": str(tenant.pk),
            "task_id": str(task_id),
            "operation_id": None,
            "reason_code": None,
            "data": payload,
            "trace_id": "",
        },
    )
    task.refresh_from_db()
    return task


# --- What-ifs: the unchanged service in a changed environment -----------------------

_AGENT_MAY = """
SELECT EXISTS (
    SELECT 1 FROM portal_agentgrant
    WHERE tenant_id = %s AND agent_id = %s AND action = %s AND target IN (%s, '*')
)
"""
_ORM_AGENT_MAY: Final = portal_selectors.agent_may


def agent_may_sql(
    *, tenant: Tenant, agent_id: uuid.UUID | str, action: str, target: str
) -> bool:
    """``portal.selectors.agent_may`` as one hand-written statement (a suggestion)."""
    with connection.cursor() as cursor:
        cursor.execute(_AGENT_MAY, [tenant.pk, agent_id, action, target])
        row = cursor.fetchone()
    return bool(row and row[0])


class WhatIfSwitch:
    """Puts Django's connection and the grant check in a flavour's environment."""

    def __init__(self) -> None:
        self.settings_options = dict(connection.settings_dict["OPTIONS"])

    def apply(self, flavour: str) -> bool:
        """Set up ``flavour``'s environment; True if Django had to reconnect."""
        what_if = WHAT_IFS.get(flavour, WhatIf())
        portal_selectors.agent_may = (
            agent_may_sql if what_if.sql_grant else _ORM_AGENT_MAY
        )
        options = {**self.settings_options, **what_if.django_options}
        if connection.settings_dict["OPTIONS"] == options:
            return False
        connection.close()
        connection.settings_dict["OPTIONS"] = options
        return True


# --- Runners: one measured operation each --------------------------------------------


@dataclass(kw_only=True)
class WorkerContext:
    """What a client process keeps across runs: its index and raw connection."""

    index: int
    raw: psycopg.Connection[Any]
    database_url: str
    _raw_like_django: psycopg.Connection[Any] | None = None
    tenant_id: str | None = None

    @property
    def owner(self) -> str:
        return owner_of(self.index)

    def raw_like_django(self) -> psycopg.Connection[Any]:
        """A second raw connection, opened on first use (diagnostic flavours)."""
        if self._raw_like_django is None:
            self._raw_like_django = connect_raw_like_django(self.database_url)
        if self.tenant_id is not None:
            raw_scope(self._raw_like_django, self.tenant_id)
        return self._raw_like_django

    def enter_tenant(self, tenant_id: str) -> None:
        """The raw connections' scope for a run (``raw_scope``)."""
        self.tenant_id = tenant_id
        raw_scope(self.raw, tenant_id)

    def server_cpu_s(self) -> float:
        """CPU seconds so far of every backend serving this client (local server),
        the peers' connections of bench/peers.py (by application name) included."""
        connection.ensure_connection()
        assert connection.connection is not None
        connections = [self.raw, connection.connection, self._raw_like_django]
        pids = [conn.info.backend_pid for conn in connections if conn]
        peers = self.raw.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            [peer_application_name(self.index)],
        ).fetchall()
        return sum(process_cpu_s(pid) for pid in pids + [row[0] for row in peers])

    def close(self) -> None:
        self.raw.close()
        if self._raw_like_django is not None:
            self._raw_like_django.close()


class _Base:
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.tenant_id = uuid.UUID(spec.tenant_id)
        self.actor = Actor(type=ActorType.AGENT, id=spec.agent_id)
        self.tenant = Tenant.objects.get(pk=self.tenant_id)

    def refill(self) -> None:
        raise RuntimeError(f"{type(self).__name__} has nothing to refill")


class _LeasedPool(_Base):
    """Each client transitions its own running, leased tasks (one per operation)."""

    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.pool = leased_pool(ctx.raw, tenant_id=self.tenant_id, owner=ctx.owner)

    def refill(self) -> None:
        self.pool = insert_tasks(
            self.ctx.raw,
            tenant_id=self.tenant_id,
            count=self.spec.refill_batch,
            owner=self.ctx.owner,
        )

    def next_task(self) -> uuid.UUID:
        if not self.pool:
            raise PoolEmpty
        return self.pool.pop()


class TransitionService(_LeasedPool):
    def op(self) -> None:
        services.task_transition(
            tenant=self.tenant,
            task_id=self.next_task(),
            to=TaskState.SUCCEEDED,
            expected_version=1,
            lease_token=1,
            actor=self.actor,
        )


class TransitionRaw(_LeasedPool):
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.conn = self.connection()
        self.cursor = self.conn.cursor()

    def connection(self) -> psycopg.Connection[Any]:
        return self.ctx.raw

    def op(self) -> None:
        task_id = self.next_task()
        with self.conn.transaction():
            raw_transition(
                self.cursor,
                tenant_id=self.tenant_id,
                task_id=task_id,
                to=TaskState.SUCCEEDED,
                expected_version=1,
                lease_token=1,
                actor=self.actor,
            )


class TransitionRawLikeDjango(TransitionRaw):
    def connection(self) -> psycopg.Connection[Any]:
        return self.ctx.raw_like_django()


class TransitionDjangoSql(_LeasedPool):
    """The raw flavour's statements and parameters through Django's atomic/cursor."""

    def op(self) -> None:
        task_id = self.next_task()
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            raw_transition(
                cursor,
                tenant_id=self.tenant_id,
                task_id=task_id,
                to=TaskState.SUCCEEDED,
                expected_version=1,
                lease_token=1,
                actor=self.actor,
            )


class TransitionOrm(_LeasedPool):
    def op(self) -> None:
        orm_task_transition(
            tenant=self.tenant,
            task_id=self.next_task(),
            to=TaskState.SUCCEEDED,
            expected_version=1,
            lease_token=1,
            actor=self.actor,
        )


class _Reservation(_Base):
    """Each client reserves fresh keys on its own leased task."""

    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        pool = leased_pool(ctx.raw, tenant_id=self.tenant_id, owner=ctx.owner)
        self.task_id = pool[0]
        self.counter = 0
        self.grant = grant_check(tenant=self.tenant, agent_id=spec.agent_id)

    def next_key(self) -> str:
        self.counter += 1
        return f"{self.spec.run_id}-r{self.spec.round}-{self.ctx.index}-{self.counter}"


class ReservationService(_Reservation):
    def op(self) -> None:
        services.operation_reserve(
            tenant=self.tenant,
            task_id=self.task_id,
            lease_token=1,
            idempotency_key=self.next_key(),
            action=RESERVATION_ACTION,
            target=RESERVATION_TARGET,
            input=RESERVATION_INPUT,
            actor=self.actor,
        )


class ReservationRaw(_Reservation):
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.conn = self.connection()
        self.cursor = self.conn.cursor()

    def connection(self) -> psycopg.Connection[Any]:
        return self.ctx.raw

    def op(self) -> None:
        key = self.next_key()
        with self.conn.transaction():
            raw_reserve(
                self.cursor,
                tenant_id=self.tenant_id,
                task_id=self.task_id,
                lease_token=1,
                idempotency_key=key,
                action=RESERVATION_ACTION,
                target=RESERVATION_TARGET,
                input=RESERVATION_INPUT,
                actor=self.actor,
            )


class ReservationRawLikeDjango(ReservationRaw):
    def connection(self) -> psycopg.Connection[Any]:
        return self.ctx.raw_like_django()


class ReservationDjangoSql(_Reservation):
    """The raw flavour's statements and parameters through Django's atomic/cursor."""

    def op(self) -> None:
        key = self.next_key()
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            raw_reserve(
                cursor,
                tenant_id=self.tenant_id,
                task_id=self.task_id,
                lease_token=1,
                idempotency_key=key,
                action=RESERVATION_ACTION,
                target=RESERVATION_TARGET,
                input=RESERVATION_INPUT,
                actor=self.actor,
            )


class _Claim(_Base):
    """All clients claim from the tenant's one pending queue, then complete."""

    def refill(self) -> None:
        insert_tasks(
            self.ctx.raw,
            tenant_id=self.tenant_id,
            count=self.spec.refill_batch,
            owner=None,
        )


class ClaimService(_Claim):
    def op(self) -> None:
        task = services.task_claim_next(
            tenant=self.tenant, owner=self.ctx.owner, actor=self.actor
        )
        if task is None:
            raise PoolEmpty
        services.task_transition(
            tenant=self.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=task.state_version,
            lease_token=task.lease_token,
            actor=self.actor,
        )


class ClaimRaw(_Claim):
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.cursor = ctx.raw.cursor()

    def op(self) -> None:
        with self.ctx.raw.transaction():
            claimed = raw_claim(
                self.cursor,
                tenant_id=self.tenant_id,
                owner=self.ctx.owner,
                actor=self.actor,
            )
        if claimed is None:
            raise PoolEmpty
        task_id, state_version, lease_token = claimed
        with self.ctx.raw.transaction():
            raw_transition(
                self.cursor,
                tenant_id=self.tenant_id,
                task_id=task_id,
                to=TaskState.SUCCEEDED,
                expected_version=state_version,
                lease_token=lease_token,
                actor=self.actor,
            )


RUNNERS: Final[dict[tuple[str, str], Callable[[RunSpec, WorkerContext], Runner]]] = {
    ("transition", "service"): TransitionService,
    ("transition", "raw"): TransitionRaw,
    ("transition", "orm"): TransitionOrm,
    ("reservation", "service"): ReservationService,
    ("reservation", "raw"): ReservationRaw,
    ("claim", "service"): ClaimService,
    ("claim", "raw"): ClaimRaw,
    # Diagnostics (bench/profile_client.py): the steps from raw to service.
    ("transition", "raw-like-django"): TransitionRawLikeDjango,
    ("transition", "django-sql"): TransitionDjangoSql,
    ("reservation", "raw-like-django"): ReservationRawLikeDjango,
    ("reservation", "django-sql"): ReservationDjangoSql,
}


# --- The raw flavour runs what the service runs ------------------------------------


@contextmanager
def captured_statements() -> Iterator[list[tuple[str, Any]]]:
    """(SQL, parameters) of every statement Django executes inside the block."""
    seen: list[tuple[str, Any]] = []

    def capture(
        execute: Callable[..., Any],
        sql: str,
        params: Any,
        many: bool,
        context: Mapping[str, Any],
    ) -> Any:
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield seen


def check_same_statements(
    raw: psycopg.Connection[Any], slug: str, workloads: tuple[str, ...] = ()
) -> None:
    """Fail unless each service executes exactly the statements its raw twin does
    (only the ``workloads`` measured, when given)."""
    tenant, agent = make_tenant(slug)
    raw_scope(raw, tenant.pk)
    with scope.tenant_scope([tenant.pk]):
        _check_same_statements(raw, tenant=tenant, agent=agent, workloads=workloads)


def _check_same_statements(
    raw: psycopg.Connection[Any],
    *,
    tenant: Tenant,
    agent: Agent,
    workloads: tuple[str, ...] = (),
) -> None:
    actor = Actor.of_agent(agent)
    leased = insert_tasks(raw, tenant_id=tenant.pk, count=2, owner="bench-check")
    insert_tasks(raw, tenant_id=tenant.pk, count=1, owner=None)
    grant_sql, _ = grant_check(tenant=tenant, agent_id=str(agent.pk))
    seen: dict[str, list[tuple[str, Any]]] = {}
    with captured_statements() as seen["transition"]:
        services.task_transition(
            tenant=tenant, task_id=leased[0], to=TaskState.SUCCEEDED,
            expected_version=1, lease_token=1, actor=actor,
        )  # fmt: skip
    with captured_statements() as seen["reservation"]:
        services.operation_reserve(
            tenant=tenant, task_id=leased[1], lease_token=1, idempotency_key="check",
            action=RESERVATION_ACTION, target=RESERVATION_TARGET,
            input=RESERVATION_INPUT, actor=actor,
        )  # fmt: skip
    with captured_statements() as seen["claim"]:
        task = services.task_claim_next(tenant=tenant, owner="bench-check", actor=actor)
        assert task is not None
        services.task_transition(
            tenant=tenant, task_id=task.pk, to=TaskState.SUCCEEDED,
            expected_version=task.state_version, lease_token=task.lease_token,
            actor=actor,
        )  # fmt: skip
    for workload, expected in STATEMENTS.items():
        if workloads and workload not in workloads:
            continue
        wanted = tuple(grant_sql if s == GRANT_CHECK else s for s in expected)
        executed = tuple(sql for sql, _ in seen[workload])
        if executed != wanted:
            pairs = zip(executed, wanted, strict=False)
            first = next(
                (i for i, (one, other) in enumerate(pairs) if one != other),
                min(len(executed), len(wanted)),
            )
            raise AssertionError(
                f"{workload}: the service executed {len(seen[workload])} statements"
                " that differ from the raw flavour's; update bench/workloads.py"
                f" (first difference at #{first}:"
                f" {executed[first : first + 1]} vs {wanted[first : first + 1]})"
            )
