"""Coordinator of ``bench/run.py``: database, client processes, runs, report.

For every workload, every client count and every flavour (service layer, raw psycopg,
and the plain ORM for the transition) it prepares a fresh tenant, hands the run to
the first N client processes, releases them together and checks the outcome in the
database. Figures go to ``docs/performance.md`` (between this benchmark's markers)
and ``reports/bench-service-layer.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import multiprocessing
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg import sql

from portal import db_roles

from . import report
from .spec import FLAVOURS, WORKLOADS, ClientResult, RunSpec
from .worker import BARRIER_TIMEOUT_S, worker_main

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal_bench"
DOCS = REPO / "docs" / "performance.md"
JSON_REPORT = REPO / "reports" / "bench-service-layer.json"
REFILL_BATCH = 1000
# Untimed operations before every round after the first (caches, after the others).
REWARMUP = 10
# Generous per-run throughput guesses that size the task pools; a client that runs
# out anyway refills untimed (reported as "refills").
POOL_RATE_TOTAL = {"transition": 4000, "claim": 2000}
POOL_RATE_PER_CLIENT_MIN = 700


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run.py",
        description="Service layer against raw psycopg, at several client counts.",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=5.0,
        help="seconds per flavour and client count",
    )
    parser.add_argument(
        "--clients", default="1,4,8", help="comma-separated client counts"
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="subset of " + str(WORKLOADS)
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="split each flavour's duration into this many slices, alternated with"
        " the other flavours' (background load then hits all flavours alike)",
    )
    parser.add_argument("--warmup", type=int, default=50, help="untimed ops/client")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL),
        help="database to DROP, create and migrate (its name must contain 'bench')",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the database's rows and only migrate it: for a database loaded"
        " with manage.py load_scale_data (bench/flat.py makes one)",
    )
    parser.add_argument(
        "--no-docs", action="store_true", help="do not update docs/performance.md"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=JSON_REPORT,
        help=f"where to write the figures (default {JSON_REPORT.relative_to(REPO)})",
    )
    parser.add_argument(
        "--what-if",
        action="store_true",
        help="also run the service with server-side binding and prepare_threshold=5"
        " forced in the settings OPTIONS, as flavour 'service-prepared' (the same as"
        " 'service' unless PORTAL_DB_PREPARE_THRESHOLD or"
        " PORTAL_DB_SERVER_SIDE_BINDING turn them off)",
    )
    parser.add_argument(
        "--unprepared",
        action="store_true",
        help="also run the service with prepare_threshold=None (Django's default,"
        " the settings before issue 11), as flavour 'service-unprepared'",
    )
    args = parser.parse_args(argv)
    args.client_counts = sorted({int(c) for c in args.clients.split(",") if c})
    args.workload_list = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workload_list) - set(WORKLOADS)
    if (
        unknown
        or not args.client_counts
        or min(args.client_counts) < 1
        or args.rounds < 1
    ):
        parser.error(f"bad --workloads {sorted(unknown)} or --clients")
    return args


def say(message: str) -> None:
    print(message, flush=True)


# --- Database --------------------------------------------------------------------


# The URL given on the command line: VACUUM is the tables' owner's (or a superuser's).
_MAINTENANCE_URL: list[str] = []


# The events ``seed`` loads (``manage.py load_scale_data``, two tenants no client is
# in). Without them the month partition the runs append to is empty when ``tidy``
# analyses it, and the generic plan of the outbox's foreign-key check onto
# audit_event, made then and kept for the run, cannot tell the (tenant_id, id) key
# from the paging indexes that begin with tenant_id: on an empty, analysed partition
# it scanned the partition for every outbox row (a transition's backend 1,027-1,233
# µs against 558-615 with the seed; 2026-12-05, docs/performance-log.md). A database
# in use has events and statistics; autovacuum gives a fresh install its own within a
# minute, a shorter time than a run.
SEED_EVENTS: Final = 20_000


def recreate_database(
    database_url: str, *, keep_rows: bool = False, seed: bool = False
) -> str:
    """DROP and CREATE the benchmark database, then migrate it with manage.py.

    With an administrator's URL the database is the owner role's and migrated as it,
    and the URL returned is the app role's, which the services run as (README,
    "Database roles"); otherwise ``database_url`` itself. ``keep_rows`` skips the
    DROP and CREATE: the database must exist already. ``seed`` loads
    ``SEED_EVENTS`` events into a new database, for the hot paths' benchmarks.
    """
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    name = str(params.get("dbname", ""))
    if "bench" not in name:
        raise SystemExit(f"refusing to drop {name!r}: its name must contain 'bench'")
    # tidy() vacuums as this URL's user: the app role owns no table, and PostgreSQL
    # skips a VACUUM or ANALYZE by a non-owner with a mere warning.
    _MAINTENANCE_URL[:] = [database_url]
    admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        if not keep_rows:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)
                )
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        elif not conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone():
            raise SystemExit(f"--reuse: there is no database {name!r}")
    app_url, owner_url = database_url, ""
    if db_roles.can_create_roles(database_url):
        db_roles.ensure_roles(database_url)
        db_roles.adopt_database(database_url)
        app_url = db_roles.url_as(database_url, user=db_roles.APP_ROLE)
        owner_url = db_roles.url_as(database_url, user=db_roles.OWNER_ROLE)
    migrate(app_url, owner_url=owner_url)
    if seed and not keep_rows:
        _manage(
            "load_scale_data", "--tasks", str(SEED_EVENTS // 10), "--events",
            str(SEED_EVENTS), "--tenants", "2", "--outbox", "0",
            database_url=app_url, owner_url=owner_url,
        )  # fmt: skip
    return app_url


def migrate(database_url: str, *, owner_url: str = "") -> None:
    """Bring the benchmark database up to the current migrations."""
    _manage("migrate", "--no-input", database_url=database_url, owner_url=owner_url)


def _manage(*command: str, database_url: str, owner_url: str) -> None:
    """One manage.py command on the benchmark database, quietly."""
    subprocess.run(
        [sys.executable, "manage.py", *command, "--verbosity", "0"],
        cwd=REPO,
        env={
            **os.environ,
            "DATABASE_URL": database_url,
            "DATABASE_OWNER_URL": owner_url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PORTAL_NO_BOOTSTRAP": "1",
            "PORTAL_DEV_MODE": "1",
        },
        check=True,
    )


def tidy(raw: psycopg.Connection[Any]) -> None:
    """Fresh statistics and no dead rows from earlier runs (autovacuum may be off)."""
    statement = (
        "VACUUM (ANALYZE) tasks_task, tasks_operation, audit_event, audit_outbox"
    )
    if not _MAINTENANCE_URL:
        raw.execute(statement)
        return
    with psycopg.connect(_MAINTENANCE_URL[0], autocommit=True) as conn:
        conn.execute(statement)


def server_facts(raw: psycopg.Connection[Any]) -> tuple[str, dict[str, str]]:
    version = raw.execute("SHOW server_version").fetchone()
    names = ["fsync", "synchronous_commit", "shared_buffers", "autovacuum"]
    rows = raw.execute(
        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)"
        " ORDER BY name",
        [names],
    ).fetchall()
    return (str(version[0]) if version else "?"), dict(rows)


# --- Clients ---------------------------------------------------------------------


class Clients:
    """The client processes, started once with one barrier per client count."""

    def __init__(self, count: int, client_counts: Sequence[int], url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.barriers: dict[int, Barrier] = {
            c: context.Barrier(c + 1) for c in client_counts
        }
        self.pipes: list[Connection] = []
        self.processes: list[SpawnProcess] = []
        for index in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=worker_main,
                args=(index, theirs, self.barriers, url),
                name=f"bench-client-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)
        for pipe in self.pipes:
            self._expect(pipe, "ready", timeout=120)

    def _expect(self, pipe: Connection, kind: str, timeout: float) -> Any:
        if not pipe.poll(timeout):
            raise RuntimeError(f"a client sent nothing for {timeout} s")
        got, payload = pipe.recv()
        if got != kind:
            raise RuntimeError(f"client failed:\n{payload}")
        return payload

    def run(self, spec: RunSpec) -> list[ClientResult]:
        pipes = self.pipes[: spec.clients]
        for pipe in pipes:
            pipe.send(spec)
        try:
            self.barriers[spec.clients].wait(BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            for pipe in pipes:  # the client that broke it says why
                if pipe.poll(5):
                    kind, payload = pipe.recv()
                    if kind == "error":
                        raise RuntimeError(payload) from None
            raise
        deadline = spec.duration_s * 4 + 60
        return [self._expect(pipe, "ok", timeout=deadline) for pipe in pipes]

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()


# --- Runs ------------------------------------------------------------------------


def prepare(
    raw: psycopg.Connection[Any],
    *,
    tag: str,
    workload: str,
    flavour: str,
    clients: int,
    args: argparse.Namespace,
) -> RunSpec:
    """A fresh tenant with the tasks all rounds of the run need; the run's spec."""
    from .workloads import insert_tasks, make_tenant, owner_of, raw_scope

    tenant, agent = make_tenant(f"bench-{tag}-{workload}-{clients}-{flavour}")
    raw_scope(raw, tenant.pk)
    warmup = args.warmup + REWARMUP * (args.rounds - 1)
    if workload == "transition":
        rate = max(POOL_RATE_TOTAL[workload] / clients, POOL_RATE_PER_CLIENT_MIN)
        per_client = warmup + math.ceil(rate * args.duration)
        for index in range(clients):
            insert_tasks(
                raw, tenant_id=tenant.pk, count=per_client, owner=owner_of(index)
            )
    elif workload == "reservation":
        for index in range(clients):
            insert_tasks(raw, tenant_id=tenant.pk, count=1, owner=owner_of(index))
    else:
        total = warmup * clients + POOL_RATE_TOTAL[workload] * args.duration
        insert_tasks(raw, tenant_id=tenant.pk, count=math.ceil(total), owner=None)
    return RunSpec(
        run_id=f"{tag}-{workload}-{clients}-{flavour}",
        round=0,
        workload=workload,
        flavour=flavour,
        clients=clients,
        duration_s=args.duration / args.rounds,
        warmup=args.warmup,
        tenant_id=str(tenant.pk),
        agent_id=str(agent.pk),
        refill_batch=REFILL_BATCH,
    )


def measure(
    clients: Clients,
    raw: psycopg.Connection[Any],
    *,
    tag: str,
    workload: str,
    count: int,
    args: argparse.Namespace,
) -> list[report.RunSummary]:
    """All flavours of one workload at one client count, in alternating rounds."""
    flavours = (
        FLAVOURS[workload]
        + (("service-prepared",) if args.what_if else ())
        + (("service-unprepared",) if args.unprepared else ())
    )
    specs = {
        flavour: prepare(
            raw, tag=tag, workload=workload, flavour=flavour, clients=count, args=args
        )
        for flavour in flavours
    }
    tidy(raw)
    rounds: dict[str, list[list[ClientResult]]] = {f: [] for f in flavours}
    for number in range(args.rounds):
        # Rotate the order, so no flavour always runs first (or right after another).
        order = flavours[number % len(flavours) :] + flavours[: number % len(flavours)]
        figures = []
        for flavour in order:
            spec = dataclasses.replace(
                specs[flavour],
                round=number,
                warmup=args.warmup if number == 0 else REWARMUP,
            )
            results = clients.run(spec)
            rounds[flavour].append(results)
            rate = sum(r.ops / r.elapsed_s for r in results if r.elapsed_s > 0)
            figures.append(f"{flavour} {rate:.0f}/s")
        line = ", ".join(figures)
        say(f"    {workload} clients={count} round {number + 1}/{args.rounds}: {line}")
    summaries = []
    for flavour in flavours:
        verify(raw, specs[flavour], [r for round_ in rounds[flavour] for r in round_])
        summaries.append(
            report.summarise(
                workload=workload,
                flavour=flavour,
                clients=count,
                rounds=rounds[flavour],
            )
        )
    for summary in summaries:
        say(report.progress_line(summary))
    return summaries


def verify(
    raw: psycopg.Connection[Any], spec: RunSpec, results: Sequence[ClientResult]
) -> None:
    """Every operation (warm-up included) committed its state, event and outbox."""
    from .workloads import raw_scope

    done = sum(r.ops + r.warmup_ops for r in results)
    raw_scope(raw, spec.tenant_id)
    row = raw.execute(
        """
        SELECT (SELECT count(*) FROM tasks_task
                WHERE tenant_id = %(t)s AND state = 'succeeded'),
               (SELECT count(*) FROM tasks_operation WHERE tenant_id = %(t)s),
               (SELECT count(*) FROM audit_event WHERE tenant_id = %(t)s),
               (SELECT count(*) FROM audit_outbox WHERE tenant_id = %(t)s)
        """,
        {"t": uuid.UUID(spec.tenant_id)},
    ).fetchone()
    assert row is not None
    expected = {
        "transition": (done, 0, done, done),
        "reservation": (0, done, done, done),
        "claim": (done, 0, 2 * done, 2 * done),
    }[spec.workload]
    if tuple(row) != expected:
        raise AssertionError(
            f"{spec.run_id}: (succeeded, operations, events, outbox) = {tuple(row)},"
            f" expected {expected}"
        )


def _command(argv: Sequence[str]) -> str:
    shown = [re.sub(r"(//[^:/@]+:)[^@]*@", r"\1***@", arg) for arg in argv]
    return shlex.join([".venv/bin/python", "bench/run.py", *shown])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.monotonic()
    verb = "migrating (rows kept)" if args.reuse else "recreating and migrating"
    say(f"bench: {verb} {args.database_url.rsplit('/', 1)[-1]}")
    args.database_url = recreate_database(
        args.database_url, keep_rows=args.reuse, seed=True
    )
    say(f"bench: the services connect as {args.database_url.split('@')[0]}")

    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("PORTAL_DEV_MODE", "1")  # benchmarks run the dev setup
    os.environ["DATABASE_URL"] = args.database_url
    import django

    django.setup()
    from django.db import connection

    from .workloads import check_same_statements, connect_raw

    tag = uuid.uuid4().hex[:8]
    raw = connect_raw(args.database_url)
    check_same_statements(
        raw, slug=f"bench-{tag}-check", workloads=tuple(args.workload_list)
    )
    connection.close()
    say("bench: the raw flavour executes the services' exact statements (checked)")
    postgres_version, postgres_settings = server_facts(raw)

    count = max(args.client_counts)
    say(f"bench: starting {count} client processes")
    clients = Clients(count, args.client_counts, args.database_url)
    summaries: list[report.RunSummary] = []
    load_before = os.getloadavg()
    try:
        for workload in args.workload_list:
            say(f"bench: {workload}")
            for n in args.client_counts:
                summaries += measure(
                    clients, raw, tag=tag, workload=workload, count=n, args=args
                )
                connection.close()
    finally:
        clients.stop()
        raw.close()
    load_after = os.getloadavg()

    import psycopg as psycopg_module
    from django import get_version

    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": _command(argv),
        "nproc": len(os.sched_getaffinity(0)),
        "platform": f"{platform.system()} {platform.machine()}",
        "postgres_version": postgres_version,
        "postgres_settings": postgres_settings,
        "python_version": platform.python_version(),
        "django_version": get_version(),
        "psycopg_version": psycopg_module.__version__,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "what_if": args.what_if,
        "unprepared": args.unprepared,
        "reuse": args.reuse,
        "warmup": args.warmup,
        "rewarmup": REWARMUP,
        "load_average_1m": [round(load_before[0], 1), round(load_after[0], 1)],
        "clients": args.client_counts,
        "wall_s": round(time.monotonic() - started, 1),
    }
    say("")
    say(report.tables(summaries))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"meta": meta, "runs": [s.as_json() for s in summaries]}, indent=2)
        + "\n"
    )
    say(f"\nbench: wrote {args.json}")
    if not args.no_docs:
        report.replace_section(DOCS, report.markdown_section(meta, summaries))
        say(f"bench: updated {DOCS.relative_to(REPO)}")
    say(f"bench: done in {meta['wall_s']} s")
    return 0
