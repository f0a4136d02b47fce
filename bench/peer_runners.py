"""The operations of ``bench/peers.py`` that ``bench/workloads.py`` does not have.

- *lean*: one statement per state change on ``bench/lean.sql``'s tables (a
  data-modifying CTE: the state change, its event and its outbox row).
- *procrastinate*: its job manager's ``fetch_job`` then ``finish_job``, what its
  worker runs for each job (the worker's own loop left out), on jobs deferred
  beforehand (untimed), in its own database.
- *dbos*: a DBOS Transact workflow of one step, called synchronously, in its own
  system database.
- *service* ``lifecycle``: register and claim, reserve, begin, verified outcome,
  succeeded: five service transactions.

Import after ``django.setup()``; the peers are imported only by their runners (the
``bench`` extra, README).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any, Final

from portal.ids import new_id
from tasks import services
from tasks.models import OperationState, TaskState

from .peer_apps import _DBOS, PROCRASTINATE_QUEUE, dbos_workflow, procrastinate_app
from .spec import LEDGER_FLAVOURS, RunSpec
from .workloads import (
    RESERVATION_ACTION,
    RESERVATION_INPUT,
    RESERVATION_TARGET,
    PoolEmpty,
    Runner,
    WorkerContext,
    _Base,
    peer_application_name,
)

# --- Lean: one round trip per state change -------------------------------------------

LEAN_TRANSITION: Final = """
WITH t AS (
    UPDATE lean.task
    SET state = %(to)s, state_version = state_version + 1, lease_owner = NULL,
        lease_expires_at = NULL, updated_at = now()
    WHERE id = %(task_id)s AND tenant_id = %(tenant_id)s AND state = %(from)s
      AND state_version = %(expected_version)s AND lease_token = %(lease_token)s
      AND lease_expires_at > now()
    RETURNING id, tenant_id, state_version
), e AS (
    INSERT INTO lean.event (id, tenant_id, task_id, code, payload, created_at)
    SELECT %(event_id)s, t.tenant_id, t.id, 'task.transitioned',
           jsonb_build_object('from', %(from)s::text, 'to', %(to)s::text,
                              'state_version', t.state_version), now()
    FROM t
    RETURNING id, tenant_id, task_id, code, payload
)
INSERT INTO lean.outbox (id, tenant_id, event_id, task_id, envelope, created_at)
SELECT %(outbox_id)s, e.tenant_id, e.id, e.task_id,
       jsonb_build_object('event_id', e.id, 'code', e.code, 'data', e.payload), now()
FROM e
RETURNING task_id
"""

LEAN_CLAIM: Final = """
WITH c AS (
    SELECT id FROM lean.task
    WHERE tenant_id = %(tenant_id)s AND state = 'pending'
    ORDER BY created_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), t AS (
    UPDATE lean.task
    SET state = 'running', state_version = task.state_version + 1,
        lease_owner = %(owner)s, lease_token = task.lease_token + 1,
        lease_expires_at = now() + interval '5 minutes', updated_at = now()
    FROM c WHERE task.id = c.id
    RETURNING task.id, task.tenant_id, task.state_version, task.lease_token
), e AS (
    INSERT INTO lean.event (id, tenant_id, task_id, code, payload, created_at)
    SELECT %(event_id)s, t.tenant_id, t.id, 'task.claimed',
           jsonb_build_object('owner', %(owner)s::text,
                              'state_version', t.state_version), now()
    FROM t
    RETURNING id, tenant_id, task_id, code, payload
), o AS (
    INSERT INTO lean.outbox (id, tenant_id, event_id, task_id, envelope, created_at)
    SELECT %(outbox_id)s, e.tenant_id, e.id, e.task_id,
           jsonb_build_object('event_id', e.id, 'code', e.code, 'data', e.payload),
           now()
    FROM e
)
SELECT id, state_version, lease_token FROM t
"""

LEAN_RESERVE: Final = """
WITH k AS (
    SELECT task.id FROM lean.task
    WHERE task.id = %(task_id)s AND task.tenant_id = %(tenant_id)s
      AND task.lease_token = %(lease_token)s AND task.lease_expires_at > now()
      AND EXISTS (
          SELECT 1 FROM lean.agent_grant g
          WHERE g.tenant_id = %(tenant_id)s AND g.agent_id = %(agent_id)s
            AND g.action = %(action)s AND g.target IN (%(target)s, '*'))
), o AS (
    INSERT INTO lean.operation (id, tenant_id, task_id, idempotency_key, action,
                                target, input_hash, input, state, created_at)
    SELECT %(id)s, %(tenant_id)s, k.id, %(key)s, %(action)s, %(target)s,
           %(input_hash)s, %(input)s, 'reserved', now()
    FROM k
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id, tenant_id, task_id
), e AS (
    INSERT INTO lean.event (id, tenant_id, task_id, code, payload, created_at)
    SELECT %(event_id)s, o.tenant_id, o.task_id, 'operation.reserved',
           jsonb_build_object('operation_id', o.id, 'idempotency_key', %(key)s::text,
                              'input_hash', %(input_hash)s::text), now()
    FROM o
    RETURNING id, tenant_id, task_id, code, payload
)
INSERT INTO lean.outbox (id, tenant_id, event_id, task_id, envelope, created_at)
SELECT %(outbox_id)s, e.tenant_id, e.id, e.task_id,
       jsonb_build_object('event_id', e.id, 'code', e.code, 'data', e.payload), now()
FROM e
RETURNING task_id
"""

_LEAN_INSERT_TASKS: Final = """
INSERT INTO lean.task (id, tenant_id, state, state_version, lease_owner, lease_token,
                       lease_expires_at, created_at, updated_at)
SELECT id, %(tenant_id)s, %(state)s, 1, %(owner)s, 1,
       CASE WHEN %(owner)s::text IS NULL THEN NULL
            ELSE now() + interval '2 hours' END,
       clock_timestamp(), clock_timestamp()
FROM unnest(%(ids)s::uuid[]) AS id
"""


def lean_insert_tasks(
    ctx: WorkerContext, *, tenant_id: uuid.UUID, count: int, owner: str | None
) -> list[uuid.UUID]:
    """``count`` lean tasks: running and leased to ``owner`` (token 1), or pending."""
    ids = [new_id() for _ in range(count)]
    ctx.raw.execute(
        _LEAN_INSERT_TASKS,
        {
            "tenant_id": tenant_id,
            "state": "running" if owner else "pending",
            "owner": owner,
            "ids": ids,
        },
    )
    return ids


def lean_grant(ctx: WorkerContext, *, tenant_id: uuid.UUID, agent_id: str) -> None:
    ctx.raw.execute(
        "INSERT INTO lean.agent_grant VALUES (%s, %s, %s, '*') ON CONFLICT DO NOTHING",
        [tenant_id, agent_id, RESERVATION_ACTION],
    )


def _lean_transition(
    ctx: WorkerContext,
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    expected_version: int,
    lease_token: int,
) -> None:
    row = ctx.raw.execute(
        LEAN_TRANSITION,
        {
            "tenant_id": tenant_id,
            "task_id": task_id,
            "from": "running",
            "to": "succeeded",
            "expected_version": expected_version,
            "lease_token": lease_token,
            "event_id": new_id(),
            "outbox_id": new_id(),
        },
    ).fetchone()
    if row is None:
        raise RuntimeError(f"lean transition of {task_id} touched no row")


class TransitionLean(_Base):
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.pool: list[uuid.UUID] = []

    def refill(self) -> None:
        self.pool = lean_insert_tasks(
            self.ctx,
            tenant_id=self.tenant_id,
            count=self.spec.refill_batch,
            owner=self.ctx.owner,
        )

    def op(self) -> None:
        if not self.pool:
            raise PoolEmpty
        _lean_transition(
            self.ctx,
            tenant_id=self.tenant_id,
            task_id=self.pool.pop(),
            expected_version=1,
            lease_token=1,
        )


class ReservationLean(_Base):
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        lean_grant(ctx, tenant_id=self.tenant_id, agent_id=spec.agent_id)
        (self.task_id,) = lean_insert_tasks(
            ctx, tenant_id=self.tenant_id, count=1, owner=ctx.owner
        )
        self.counter = 0

    def op(self) -> None:
        self.counter += 1
        key = f"{self.spec.run_id}-r{self.spec.round}-{self.ctx.index}-{self.counter}"
        canonical = json.dumps(RESERVATION_INPUT, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        row = self.ctx.raw.execute(
            LEAN_RESERVE,
            {
                "tenant_id": self.tenant_id,
                "task_id": self.task_id,
                "lease_token": 1,
                "agent_id": self.spec.agent_id,
                "action": RESERVATION_ACTION,
                "target": RESERVATION_TARGET,
                "id": new_id(),
                "key": key,
                "input_hash": digest,
                "input": json.dumps(RESERVATION_INPUT),
                "event_id": new_id(),
                "outbox_id": new_id(),
            },
        ).fetchone()
        if row is None:
            raise RuntimeError(f"lean reservation {key} touched no row")


class ClaimLean(_Base):
    """Claim the oldest pending lean task, then move it to succeeded."""

    def refill(self) -> None:
        lean_insert_tasks(
            self.ctx, tenant_id=self.tenant_id, count=self.spec.refill_batch, owner=None
        )

    def op(self) -> None:
        row = self.ctx.raw.execute(
            LEAN_CLAIM,
            {
                "tenant_id": self.tenant_id,
                "owner": self.ctx.owner,
                "event_id": new_id(),
                "outbox_id": new_id(),
            },
        ).fetchone()
        if row is None:
            raise PoolEmpty
        task_id, state_version, lease_token = row
        _lean_transition(
            self.ctx,
            tenant_id=self.tenant_id,
            task_id=task_id,
            expected_version=state_version,
            lease_token=lease_token,
        )


# --- Procrastinate -------------------------------------------------------------------

_PROCRASTINATE: dict[str, Any] = {}


class ClaimProcrastinate(_Base):
    """What Procrastinate's worker does per job: fetch it, run it, finish it.

    One app, event loop and registered worker per client process, kept across runs.
    """

    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        from procrastinate import jobs

        self.succeeded = jobs.Status.SUCCEEDED
        if not _PROCRASTINATE:
            loop = asyncio.new_event_loop()
            app = procrastinate_app(
                spec.peer_url, application_name=peer_application_name(ctx.index)
            )
            loop.run_until_complete(app.open_async())
            _PROCRASTINATE.update(loop=loop, app=app)
        self.loop: asyncio.AbstractEventLoop = _PROCRASTINATE["loop"]
        self.app = _PROCRASTINATE["app"]
        self.task = self.app.tasks["bench_job"]
        self.manager = self.app.job_manager
        if "worker_id" not in _PROCRASTINATE:
            _PROCRASTINATE["worker_id"] = self.loop.run_until_complete(
                self.manager.register_worker()
            )
        self.worker_id = _PROCRASTINATE["worker_id"]

    def refill(self) -> None:
        self.loop.run_until_complete(
            self.task.batch_defer_async(
                *({"n": n} for n in range(self.spec.refill_batch))
            )
        )

    def op(self) -> None:
        job = self.loop.run_until_complete(
            self.manager.fetch_job(
                queues=[PROCRASTINATE_QUEUE], worker_id=self.worker_id
            )
        )
        if job is None:
            raise PoolEmpty
        self.task(**job.task_kwargs)
        self.loop.run_until_complete(
            self.manager.finish_job(job=job, status=self.succeeded, delete_job=False)
        )


def close() -> None:
    """Let go of this process's peer connections (the client process is ending)."""
    if _PROCRASTINATE:
        loop = _PROCRASTINATE["loop"]
        manager = _PROCRASTINATE["app"].job_manager
        if "worker_id" in _PROCRASTINATE:
            loop.run_until_complete(
                manager.unregister_worker(worker_id=_PROCRASTINATE["worker_id"])
            )
        loop.run_until_complete(_PROCRASTINATE["app"].close_async())
        loop.close()
        _PROCRASTINATE.clear()
    if _DBOS:
        from dbos import DBOS

        DBOS.destroy()
        _DBOS.clear()


# --- DBOS Transact -------------------------------------------------------------------


class LifecycleDbos(_Base):
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.workflow = dbos_workflow(
            spec.peer_url, application_name=peer_application_name(ctx.index)
        )
        self.counter = 0

    def op(self) -> None:
        self.counter += 1
        if self.workflow(self.counter) != self.counter + 1:
            raise RuntimeError("DBOS workflow returned the wrong value")


# --- The service layer's whole task lifecycle ----------------------------------------


class LifecycleService(_Base):
    """register and claim → reserve → begin → verified outcome → succeeded."""

    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.counter = 0

    def op(self) -> None:
        self.counter += 1
        name = f"{self.spec.run_id}-r{self.spec.round}-{self.ctx.index}-{self.counter}"
        # Registered and claimed in one transaction (``claim_owner``).
        task = services.task_register(
            tenant=self.tenant,
            actor=self.actor,
            client_task_id=name,
            workflow_key="bench",
            workflow_version="1",
            object_type="bench_object",
            object_id=name,
            object_version="1",
            claim_owner=self.ctx.owner,
        ).task
        reservation = services.operation_reserve(
            tenant=self.tenant,
            task_id=task.pk,
            lease_token=task.lease_token,
            idempotency_key=name,
            action=RESERVATION_ACTION,
            target=RESERVATION_TARGET,
            input=RESERVATION_INPUT,
            actor=self.actor,
        )
        operation = reservation.operation
        services.operation_begin_execution(
            tenant=self.tenant,
            operation_id=operation.pk,
            lease_token=task.lease_token,
            actor=self.actor,
        )
        services.operation_record_outcome(
            tenant=self.tenant,
            operation_id=operation.pk,
            lease_token=task.lease_token,
            outcome=OperationState.VERIFIED,
            provider_reference=f"receipt-{name}",
            actor=self.actor,
        )
        services.task_transition(
            tenant=self.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=task.state_version,
            lease_token=task.lease_token,
            actor=self.actor,
        )


# --- The guarantee-cost ledger: the lean baseline, one guarantee at a time -----------
#
# ``bench/peers.py --ledger``: the transition and the reservation on lean tables to
# which the services' guarantees are added one at a time, each step its own schema
# (``ledger_<n>``) with every guarantee of the steps before it, so that the steps
# run in the same interleaved rounds and each row's CPU less the row above is what
# that guarantee costs. The mechanisms are the services' own where they can be
# shared: the row-level security policy calls ``portal_tenant_scope()``, the guard
# trigger is ``tasks_task_guard_update()`` (migration tasks/0002), the chain link is
# a head row moved under its lock with two SHA-256s (the payload's, the link's), the
# outbox row is written from the event, and the event table is range-partitioned by
# month on its UUIDv7 ``id`` (audit migration 0011). The services' further costs
# (their indexes and checks, the transparency-log stamps, Python) are the last row.
# The steps are ``bench/spec.py``'s ``LEDGER_STEPS``; their schemas
# ``bench/peers.py``'s ``ledger_ddl``.


def _ledger_step(flavour: str) -> int:
    return LEDGER_FLAVOURS.index(flavour)


def _ledger_event_sql(schema: str, number: int, *, source: str, payload: str) -> str:
    """CTEs after ``source`` (one row with ``tenant_id`` and ``task_id``): the event
    (its chain link from step 3) and, from step 4, its outbox row; ends in a SELECT.

    The head row is found by its key's parameters, as the services' statement finds
    it (``audit/services.py``): joined on ``source``'s columns instead, the planner
    took a sequential scan of every head row (+558 µs a transition on a quiet
    machine, 2026-12-05), a cost of the benchmark, not of the chain."""
    if number >= 3:
        event = f"""
, body AS (
    SELECT {source}.tenant_id, {source}.task_id, {payload} AS payload FROM {source}
), digested AS (
    SELECT body.*, encode(sha256(convert_to(body.payload::text, 'UTF8')), 'hex')
        AS digest
    FROM body
), link AS (
    UPDATE {schema}.chainhead AS h
    SET head_seq = h.head_seq + 1,
        head_hash = encode(sha256(convert_to(COALESCE(h.head_hash, '0')
            || %(event_id)s::text || digested.digest || now()::text, 'UTF8')), 'hex')
    FROM digested
    WHERE h.tenant_id = %(tenant_id)s AND h.task_id = %(task_id)s
    RETURNING h.head_seq, h.head_hash
), e AS (
    INSERT INTO {schema}.event (id, tenant_id, task_id, code, payload,
        payload_digest, chain_seq, prev_hash, hash, created_at)
    SELECT %(event_id)s, digested.tenant_id, digested.task_id, %(code)s,
        digested.payload, digested.digest, link.head_seq, NULL, link.head_hash, now()
    FROM digested, link
    RETURNING id, tenant_id, task_id, code, payload
)"""
    else:
        event = f"""
, e AS (
    INSERT INTO {schema}.event (id, tenant_id, task_id, code, payload, created_at)
    SELECT %(event_id)s, {source}.tenant_id, {source}.task_id, %(code)s, {payload},
        now()
    FROM {source}
    RETURNING id, tenant_id, task_id, code, payload
)"""
    if number < 4:
        return event + "\nSELECT task_id FROM e"
    return (
        event
        + f"""
INSERT INTO {schema}.outbox (id, tenant_id, event_id, task_id, envelope, created_at)
SELECT %(outbox_id)s, e.tenant_id, e.id, e.task_id,
       jsonb_build_object('event_id', e.id, 'code', e.code, 'data', e.payload), now()
FROM e
RETURNING task_id"""
    )


@functools.cache
def ledger_transition_sql(number: int) -> str:
    schema = f"ledger_{number}"
    return f"""
WITH t AS (
    UPDATE {schema}.task
    SET state = %(to)s, state_version = state_version + 1, lease_owner = NULL,
        lease_expires_at = NULL, updated_at = now()
    WHERE id = %(task_id)s AND tenant_id = %(tenant_id)s AND state = %(from)s
      AND state_version = %(expected_version)s AND lease_token = %(lease_token)s
      AND lease_expires_at > now()
    RETURNING id AS task_id, tenant_id, state_version
)""" + _ledger_event_sql(
        schema,
        number,
        source="t",
        payload="jsonb_build_object('from', %(from)s::text, 'to', %(to)s::text,"
        " 'state_version', t.state_version)",
    )


@functools.cache
def ledger_reserve_sql(number: int) -> str:
    schema = f"ledger_{number}"
    return f"""
WITH k AS (
    SELECT task.id FROM {schema}.task
    WHERE task.id = %(task_id)s AND task.tenant_id = %(tenant_id)s
      AND task.lease_token = %(lease_token)s AND task.lease_expires_at > now()
      AND EXISTS (
          SELECT 1 FROM {schema}.agent_grant g
          WHERE g.tenant_id = %(tenant_id)s AND g.agent_id = %(agent_id)s
            AND g.action = %(action)s AND g.target IN (%(target)s, '*'))
), o AS (
    INSERT INTO {schema}.operation (id, tenant_id, task_id, idempotency_key, action,
                                    target, input_hash, input, state, created_at)
    SELECT %(id)s, %(tenant_id)s, k.id, %(key)s, %(action)s, %(target)s,
           %(input_hash)s, %(input)s, 'reserved', now()
    FROM k
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id, tenant_id, task_id
)""" + _ledger_event_sql(
        schema,
        number,
        source="o",
        payload="jsonb_build_object('operation_id', o.id, 'idempotency_key',"
        " %(key)s::text, 'input_hash', %(input_hash)s::text)",
    )


def _ledger_insert_tasks(
    ctx: WorkerContext, *, number: int, tenant_id: uuid.UUID, count: int
) -> list[uuid.UUID]:
    """Running tasks leased to the client (token 1), their chains begun (step 3 on)."""
    schema = f"ledger_{number}"
    ids = [new_id() for _ in range(count)]
    with ctx.raw.transaction():
        ctx.raw.execute(
            f"INSERT INTO {schema}.task (id, tenant_id, state, state_version,"
            " lease_owner, lease_token, lease_expires_at, created_at, updated_at)"
            " SELECT id, %(tenant_id)s, 'running', 1, %(owner)s, 1,"
            " now() + interval '2 hours', clock_timestamp(), clock_timestamp()"
            " FROM unnest(%(ids)s::uuid[]) AS id",
            {"tenant_id": tenant_id, "owner": ctx.owner, "ids": ids},
        )
        ctx.raw.execute(
            f"INSERT INTO {schema}.chainhead (tenant_id, task_id, head_seq)"
            " SELECT %(tenant_id)s, id, 0 FROM unnest(%(ids)s::uuid[]) AS id",
            {"tenant_id": tenant_id, "ids": ids},
        )
    return ids


class TransitionLedger(_Base):
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.number = _ledger_step(spec.flavour)
        self.sql = ledger_transition_sql(self.number)
        self.pool: list[uuid.UUID] = []

    def refill(self) -> None:
        self.pool = _ledger_insert_tasks(
            self.ctx,
            number=self.number,
            tenant_id=self.tenant_id,
            count=self.spec.refill_batch,
        )

    def op(self) -> None:
        if not self.pool:
            raise PoolEmpty
        task_id = self.pool.pop()
        row = self.ctx.raw.execute(
            self.sql,
            {
                "tenant_id": self.tenant_id,
                "task_id": task_id,
                "from": "running",
                "to": "succeeded",
                "expected_version": 1,
                "lease_token": 1,
                "code": "task.transitioned",
                "event_id": new_id(),
                "outbox_id": new_id(),
            },
        ).fetchone()
        if row is None:
            raise RuntimeError(f"ledger transition of {task_id} touched no row")


class ReservationLedger(_Base):
    def __init__(self, spec: RunSpec, ctx: WorkerContext) -> None:
        super().__init__(spec, ctx)
        self.number = _ledger_step(spec.flavour)
        self.sql = ledger_reserve_sql(self.number)
        ctx.raw.execute(
            f"INSERT INTO ledger_{self.number}.agent_grant VALUES (%s, %s, %s, '*')"
            " ON CONFLICT DO NOTHING",
            [self.tenant_id, spec.agent_id, RESERVATION_ACTION],
        )
        (self.task_id,) = _ledger_insert_tasks(
            ctx, number=self.number, tenant_id=self.tenant_id, count=1
        )
        self.counter = 0
        canonical = json.dumps(RESERVATION_INPUT, sort_keys=True, separators=(",", ":"))
        self.digest = hashlib.sha256(canonical.encode()).hexdigest()

    def op(self) -> None:
        self.counter += 1
        key = f"{self.spec.run_id}-r{self.spec.round}-{self.ctx.index}-{self.counter}"
        row = self.ctx.raw.execute(
            self.sql,
            {
                "tenant_id": self.tenant_id,
                "task_id": self.task_id,
                "lease_token": 1,
                "agent_id": self.spec.agent_id,
                "action": RESERVATION_ACTION,
                "target": RESERVATION_TARGET,
                "id": new_id(),
                "key": key,
                "input_hash": self.digest,
                "input": json.dumps(RESERVATION_INPUT),
                "code": "operation.reserved",
                "event_id": new_id(),
                "outbox_id": new_id(),
            },
        ).fetchone()
        if row is None:
            raise RuntimeError(f"ledger reservation {key} touched no row")


RUNNERS: Final[dict[tuple[str, str], Callable[[RunSpec, WorkerContext], Runner]]] = {
    ("transition", "lean"): TransitionLean,
    ("reservation", "lean"): ReservationLean,
    ("claim", "lean"): ClaimLean,
    ("claim", "procrastinate"): ClaimProcrastinate,
    ("lifecycle", "dbos"): LifecycleDbos,
    ("lifecycle", "service"): LifecycleService,
    **{("transition", flavour): TransitionLedger for flavour in LEDGER_FLAVOURS},
    **{("reservation", flavour): ReservationLedger for flavour in LEDGER_FLAVOURS},
}
