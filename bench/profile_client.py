"""Where one client's time goes, for one workload, in one process.

    .venv/bin/python bench/profile_client.py [--workload transition] [--ops 3000]
        [--rounds 5] [--profile service] [--top 30]
        [--database-url postgres://.../portal_bench]

Drops, creates and migrates the benchmark database (as ``bench/run.py`` does) and
runs as the app role, under row-level security, as the portal does (each flavour in
a tenant of its own; the raw connection sees those tenants through a session-wide
scope). Prints, per operation:

1. wall and client CPU time of each step from raw to service (interleaved rounds):
   ``raw`` (psycopg defaults), ``raw-like-django`` (client-side binding, no prepared
   statements, as Django configures psycopg), ``django-sql`` (the same statements
   through ``transaction.atomic`` and ``connection.cursor()``), ``service``, and the
   plain ORM where it exists;
   what-ifs run the unchanged service in a changed environment: ``service-prepared``
   on a Django connection with server-side binding and prepared statements (a
   settings change), ``service-sql-grant`` with the grant check as one hand-written
   statement (``bench.workloads.agent_may_sql``), and both;
2. the cost of the service's own Python steps, timed in isolation;
3. a cProfile of the ``--profile`` flavour.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.service_layer import DEFAULT_DATABASE_URL, recreate_database  # noqa: E402
from bench.spec import (  # noqa: E402
    DIAGNOSTIC_FLAVOURS,
    WORKLOADS,
    RunSpec,
    runner_flavour,
)

WARMUP = 100
# Untimed operations after the Django connection was reconfigured (re-prepare).
REWARM = 20


def _us(function: Callable[[], Any], number: int = 2000) -> float:
    """Best-of-five microseconds per call, unprofiled."""
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e6


def components(workload: str, raw: Any) -> list[tuple[str, float]]:
    """The service's Python steps (no I/O), each timed alone."""
    from django.db import connection, transaction

    from audit import services as audit_services
    from audit.redaction import redact
    from bench import workloads
    from portal import db as portal_db
    from portal import scope
    from portal import selectors as portal_selectors
    from portal.actors import ActorType
    from portal.ids import new_id
    from tasks import task_state
    from tasks.hashing import input_hash
    from tasks.models import Operation, Task, TaskState
    from tasks.services.operations import OPERATION_COLUMNS, operation_from_row
    from tasks.services.tasks import _TRANSITION

    tenant, agent = workloads.make_tenant(f"bench-parts-{uuid.uuid4().hex[:8]}")
    scope.include(tenant.pk)  # row-level security, as in main()
    workloads.raw_scope(raw, tenant.pk)
    (task_id,) = workloads.insert_tasks(raw, tenant_id=tenant.pk, count=1, owner="p")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {task_state.TASK_COLUMNS} FROM tasks_task AS t WHERE id = %s",
            [task_id],
        )
        task_row = cursor.fetchone()
    params = _TRANSITION.params(
        moves={"running": "succeeded"},
        params={
            "reason": None, "step": None, "wake_at": None,
            "keep_lease": False, "tenant_id": tenant.pk, "task_id": task_id,
            "expected_version": 1, "lease_token": 1,
        },
    )  # fmt: skip
    data = {
        "from": "running", "to": "succeeded", "state_version": 2, "step": "",
        "lease_token": 1, "data": {},
    }  # fmt: skip
    client = workloads.connect_raw_like_django(raw.info.dsn)
    workloads.raw_scope(client, tenant.pk)
    client_cursor = client.cursor()

    def atomic_empty() -> None:
        with transaction.atomic(durable=True):
            pass

    def cursor_open_close() -> None:
        with connection.cursor():
            pass

    def in_atomic(function: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> None:
            with transaction.atomic(durable=True):
                function()

        return run

    parts = [
        ("transaction.atomic(durable=True) enter+exit, no query", _us(atomic_empty)),
        ("connection.cursor() open+close", _us(cursor_open_close)),
        (
            "portal_db.require_transaction() (inside atomic, minus the atomic)",
            _us(in_atomic(portal_db.require_transaction)) - _us(atomic_empty),
        ),
        (
            "ClientCursor.mogrify(_TRANSITION, params) (client-side binding)",
            _us(lambda: client_cursor.mogrify(_TRANSITION.sql, params)),  # type: ignore[attr-defined]
        ),
        ("`to not in TaskState.values`", _us(lambda: "x" in TaskState.values)),
        (
            "redact(transition data)",
            _us(lambda: redact(data, tenant_id=tenant.pk)),
        ),
        (
            "model_from_row(Task, row)",
            _us(
                lambda: portal_db.model_from_row(
                    Task, task_state.TASK_ATTNAMES, task_row
                )
            ),
        ),
        ("new_id()", _us(new_id)),
        ("json_text(payload)", _us(lambda: audit_services.json_text(data))),
    ]
    if workload == "reservation":
        from portal.models import AgentGrant

        def grant_sql() -> None:
            query = AgentGrant.objects.filter(
                tenant=tenant, agent_id=str(agent.pk), action="create_ticket",
                target__in=["ticket-desk", "*"],
            ).query.exists()  # fmt: skip
            query.get_compiler(using="default").as_sql()

        operation = Operation(
            tenant=tenant, task_id=task_id, idempotency_key="k", action="a",
            target="t", input_hash="0" * 64, input=workloads.RESERVATION_INPUT,
        )  # fmt: skip
        operation.save()
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {OPERATION_COLUMNS} FROM tasks_operation AS o WHERE id = %s",
                [operation.pk],
            )
            operation_row = cursor.fetchone()

        def grant_call() -> None:
            portal_selectors.agent_may(
                tenant=tenant,
                agent_id=str(agent.pk),
                action="create_ticket",
                target="ticket-desk",
            )

        def operation_model() -> None:
            operation_from_row(operation_row)

        parts += [
            ("agent_may: build + compile its ORM query", _us(grant_sql, 500)),
            ("agent_may: whole call (one round trip)", _us(grant_call, 500)),
            (
                "input_hash(input) (rfc8785)",
                _us(lambda: input_hash(workloads.RESERVATION_INPUT)),
            ),
            ("model_from_row(Operation, row)", _us(operation_model)),
            ("actor.type == ActorType.AGENT", _us(lambda: ActorType.AGENT == "agent")),
        ]
    client.close()
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/profile_client.py")
    parser.add_argument("--workload", choices=WORKLOADS, default="transition")
    parser.add_argument("--profile", default="service", help="flavour to cProfile")
    parser.add_argument("--ops", type=int, default=3000, help="per flavour")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL),
    )
    args = parser.parse_args()
    flavours = DIAGNOSTIC_FLAVOURS[args.workload]
    if args.profile not in flavours:
        parser.error(f"--profile must be one of {flavours}")
    app_url = recreate_database(args.database_url, seed=True)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("PORTAL_DEV_MODE", "1")  # benchmarks run the dev setup
    os.environ["DATABASE_URL"] = app_url
    import django

    django.setup()

    from bench import workloads
    from portal import scope

    raw = workloads.connect_raw(app_url)
    # VACUUM is the tables' owner's (or a superuser's): the URL given.
    maintenance = workloads.connect_raw(args.database_url)
    ctx = workloads.WorkerContext(index=0, raw=raw, database_url=app_url)
    tenants: list[str] = []
    what_ifs = workloads.WhatIfSwitch()
    configure = what_ifs.apply

    def runner(flavour: str, ops: int) -> workloads.Runner:
        tag = uuid.uuid4().hex[:8]
        tenant, agent = workloads.make_tenant(f"bench-profile-{tag}-{flavour}")
        # Row-level security: the flavours' operations run in the tenants made here,
        # and the raw connection sees all of them.
        scope.include(tenant.pk)
        tenants.append(str(tenant.pk))
        ctx.enter_tenant(",".join(tenants))  # the setting takes a list
        owner = None if args.workload == "claim" else ctx.owner
        count = 1 if args.workload == "reservation" else ops + WARMUP
        count += REWARM * args.rounds
        workloads.insert_tasks(raw, tenant_id=tenant.pk, count=count, owner=owner)
        maintenance.execute("VACUUM (ANALYZE) tasks_task")
        spec = RunSpec(
            run_id=f"profile-{tag}", round=0, workload=args.workload,
            flavour=flavour, clients=1, duration_s=0, warmup=WARMUP,
            tenant_id=str(tenant.pk), agent_id=str(agent.pk), refill_batch=0,
        )  # fmt: skip
        configure(flavour)
        made = workloads.RUNNERS[args.workload, runner_flavour(flavour)](spec, ctx)
        for _ in range(WARMUP):
            made.op()
        return made

    per_round = max(1, args.ops // args.rounds)
    runners = {
        flavour: runner(flavour, per_round * args.rounds) for flavour in flavours
    }
    walls: dict[str, list[float]] = {flavour: [] for flavour in flavours}
    cpus: dict[str, list[float]] = {flavour: [] for flavour in flavours}
    servers: dict[str, list[float]] = {flavour: [] for flavour in flavours}
    for number in range(args.rounds):
        shift = number % len(flavours)
        for flavour in flavours[shift:] + flavours[:shift]:
            made = runners[flavour]
            if configure(flavour):
                for _ in range(REWARM):
                    made.op()
            server = ctx.server_cpu_s()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(per_round):
                made.op()
            walls[flavour].append((time.perf_counter() - wall) / per_round * 1e6)
            cpus[flavour].append((time.process_time() - cpu) / per_round * 1e6)
            servers[flavour].append((ctx.server_cpu_s() - server) / per_round * 1e6)
    print(
        f"{args.workload}: one client, {args.rounds} interleaved rounds of"
        f" {per_round} ops per flavour; medians over rounds, per operation"
    )
    base_wall = statistics.median(walls["raw"])
    base_cpu = statistics.median(cpus["raw"])
    base_server = statistics.median(servers["raw"])
    for flavour in flavours:
        wall = statistics.median(walls[flavour])
        cpu = statistics.median(cpus[flavour])
        server = statistics.median(servers[flavour])
        print(
            f"  {flavour:<26} wall {wall:6.0f} us ({100 * base_wall / wall:3.0f} % of"
            f" raw's rate)  CPU: client {cpu:5.0f} us (+{cpu - base_cpu:4.0f}),"
            f" server {server:5.0f} us (+{server - base_server:4.0f})"
        )

    configure("service")  # the project's own environment again
    print("\nthe service's own steps, timed alone (best of 5, unprofiled):")
    for label, micros in components(args.workload, raw):
        print(f"  {micros:7.1f} us  {label}")

    made = runner(args.profile, args.ops)
    configure(args.profile)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.ops):
        made.op()
    profiler.disable()
    print(f"\ncProfile of {args.profile}, {args.ops} ops (divide times by that):")
    stats = pstats.Stats(profiler).strip_dirs()
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    raw.close()
    maintenance.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
