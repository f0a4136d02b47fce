"""The services against the peers a user would pick instead, in one run.

    .venv/bin/pip install -e '.[bench]' -c constraints.txt   # once: the peers
    .venv/bin/python bench/peers.py [--duration 3] [--clients 1,4,8] [--rounds 3]
        [--database-url postgres://postgres@127.0.0.1:5432/portal_bench_peers]
        [--also rest,relay,doors] [--rest-clients 1,4,16] [--relay-rate 2000]
        [--no-docs] [--json reports/bench-peers.json]
    .venv/bin/python bench/peers.py --ledger [--clients 1] [--no-docs] ...

In the same interleaved rounds as ``bench/run.py`` (same client processes, barrier,
slices in rotating order), on one PostgreSQL server:

- full task lifecycle through the services (five transactions: register and claim,
  reserve, begin, outcome, succeeded) against DBOS Transact one-step workflows;
- claim → complete through the services against Procrastinate's worker steps per
  job (and the lean claim);
- transition and reservation through the services against the lean baseline, one
  data-modifying CTE per state change on tables without triggers (bench/lean.sql).

Then, in the same command, the issue's other rows from their own benchmarks
(``--also``): the REST reservation under gunicorn against raw SQL (``bench/api.py``
on ``<name>_rest``, keep-alive clients and a ``Connection: close`` row), the outbox
relay with publisher confirms, its throughput and commit→publish lag at
``--relay-rate`` (``bench/relay.py`` on ``<name>_relay``; needs RabbitMQ,
``BENCH_BROKER_URL``), and the agent's doors: the one-call action against the
six-call lifecycle, and an MCP tool call against the REST one call at 1 and 8
clients (``bench/doors.py`` on ``<name>_doors``: ``manage.py up --no-worker`` with
the real ticket desk).

Drops and creates its databases: the services' (name must contain "bench"), and
the peers' own, ``<name>_procrastinate``, ``<name>_dbos``, ``<name>_rest``,
``<name>_relay`` and ``<name>_doors``, dropped again at the end.

``--ledger``: the guarantee-cost ledger instead. The transition and the reservation
on the lean tables with the services' guarantees added one at a time (row-level
security, the guard trigger, the hash chain, the outbox row, the month-partitioned
event table; ``bench/peer_runners.py``, ``LEDGER_STEPS``), then the services'
statements by raw psycopg on the services' schema, then the services, in the same
interleaved rounds: the CPU per operation, client and backend, of each step
and what each step adds to the one before. It writes its own section of
docs/performance.md (``ledger``) and leaves the issue's table alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

# Run as a script: make the repository, not bench/, the first import root.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import psycopg
from psycopg import sql

from bench import report
from bench.service_layer import (
    REWARMUP,
    Clients,
    prepare,
    recreate_database,
    say,
    server_facts,
    tidy,
    verify,
)
from bench.spec import (
    LEDGER_FLAVOURS,
    LEDGER_LABELS,
    LEDGER_STEPS,
    ClientResult,
    RunSpec,
)

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "performance.md"
JSON_REPORT = REPO / "reports" / "bench-peers.json"
SECTION = "peers"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal_bench_peers"

# (workload, ours, the peer, aim as peer multiple or share, how the ratio reads)
ROWS: Final = (
    ("lifecycle", "service", "dbos", 1.0,
     "full task lifecycle (register and claim → reserve → begin → verified outcome"
     " → succeeded) vs DBOS Transact one-step workflows"),
    ("claim", "service", "procrastinate", 2.0,
     "claim → complete through the services vs Procrastinate jobs processed"),
    ("claim", "lean", "procrastinate", 0.0,
     "(reference) lean claim → complete vs Procrastinate jobs processed"),
    ("transition", "service", "lean", 0.5,
     "service transition vs lean raw psycopg transition (one CTE, no triggers)"),
    ("reservation", "service", "lean", 0.4,
     "reservation through the services vs lean raw reservation (one CTE)"),
)  # fmt: skip
# Rows of the issue measured by their own benchmarks, run as subprocesses by main():
# REST reserve under gunicorn against raw SQL (bench/api.py), the relay with publisher
# confirms and its commit→publish lag (bench/relay.py), the one call and the MCP tool
# call (bench/doors.py).
SIDE_BENCHMARKS: Final = ("rest", "relay", "doors")
REST_AIM: Final = 0.40  # of raw SQL's reservations/s
ONE_CALL_AIM: Final = 2.0  # the one call's rate over the six-call lifecycle's
MCP_ADDS_AIM_MS: Final = 5.0  # MCP p50 over the REST one call's
REST_P99_AIM_MS: Final = 50.0  # at the most clients
RELAY_AIM: Final = 5000.0  # events/s
RELAY_LAG_AIM_MS: Final = 100.0  # p99 at the offered rate (issue 23: 2,000/s)
# Lifecycle last: once launched, DBOS keeps its threads in the client processes.
FLAVOURS: Final[dict[str, tuple[str, ...]]] = {
    "transition": ("lean", "service"),
    "reservation": ("lean", "service"),
    "claim": ("procrastinate", "lean", "service"),
    "lifecycle": ("dbos", "service"),
}
LEDGER_SECTION: Final = "ledger"
LEDGER_WORKLOADS: Final = ("transition", "reservation")
# After the steps: the services' own statements sent by raw psycopg on the services'
# schema (``bench/workloads.py``'s raw flavour: every table's indexes, CHECKs, foreign
# keys and triggers, no Django), then the services themselves. The first splits what
# the services add over the last step into the schema's share and the Python's.
LEDGER_ROWS: Final = (*LEDGER_FLAVOURS, "raw", "service")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/peers.py", description=__doc__)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20, help="untimed ops/client")
    parser.add_argument("--workloads", default=",".join(FLAVOURS))
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_PEERS_DATABASE_URL", DEFAULT_DATABASE_URL),
        help="an administrator's URL of the database to DROP and create ('bench')",
    )
    parser.add_argument(
        "--also",
        default=",".join(SIDE_BENCHMARKS),
        help="the issue's other rows, from their own benchmarks run by this command:"
        f" a subset of {','.join(SIDE_BENCHMARKS)}, or '' for none",
    )
    parser.add_argument("--rest-clients", default="1,4,16")
    parser.add_argument(
        "--relay-rate", type=float, default=2000, help="steady events/s for the lag"
    )
    parser.add_argument(
        "--ledger",
        action="store_true",
        help="the guarantee-cost ledger (transition and reservation, the lean"
        " baseline with one guarantee added at a time, then the services) instead",
    )
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--json", type=Path, default=JSON_REPORT)
    args = parser.parse_args(argv)
    args.flavours = dict(FLAVOURS)
    if args.ledger:
        args.flavours = dict.fromkeys(LEDGER_WORKLOADS, LEDGER_ROWS)
        if args.workloads == ",".join(FLAVOURS):
            args.workloads = ",".join(LEDGER_WORKLOADS)
        args.also = ""
    args.client_counts = sorted({int(c) for c in args.clients.split(",") if c})
    args.workload_list = [w for w in args.workloads.split(",") if w]
    if set(args.workload_list) - set(args.flavours) or not args.client_counts:
        parser.error("bad --workloads or --clients")
    args.what_if = False
    return args


# --- The peers' databases ------------------------------------------------------------


def _recreate(admin_url: str, name: str, *, drop_only: bool = False) -> str:
    if "bench" not in name:
        raise SystemExit(f"refusing to drop {name!r}: its name must contain 'bench'")
    with psycopg.connect(
        psycopg.conninfo.make_conninfo(admin_url, dbname="postgres"), autocommit=True
    ) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
        if not drop_only:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return urllib.parse.urlsplit(admin_url)._replace(path=f"/{name}").geturl()


def setup_lean(admin_url: str, app_url: str, *, ledger: bool = False) -> None:
    """bench/lean.sql in the services' database, usable by the role they run as;
    with ``ledger``, the ledger's schemas too (``peer_runners.ledger_ddl``)."""
    role = str(psycopg.conninfo.conninfo_to_dict(app_url).get("user") or "postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute((REPO / "bench" / "lean.sql").read_text().encode())
        if ledger:
            conn.execute(ledger_ddl(role).encode())
        conn.execute(
            sql.SQL(
                "GRANT USAGE ON SCHEMA lean TO {0};"
                " GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA lean"
                " TO {0}"
            ).format(sql.Identifier(role))
        )


def _uuid7_floor(when: dt.datetime) -> str:
    """The smallest UUIDv7 of the millisecond ``when`` (a partition bound)."""
    millis = int(when.timestamp() * 1000)
    text = f"{millis:012x}" + "7000" + "8" + "0" * 15
    return str(uuid.UUID(text))


def _month_bounds(months: int) -> list[tuple[str, str, str]]:
    """(name, from, to) of the month partitions around today, UUIDv7 bounds."""
    today = dt.datetime.now(dt.UTC).replace(
        day=1, hour=0, minute=0, second=0, microsecond=0
    )
    starts = []
    year, month = today.year, today.month - 1
    for _ in range(months + 1):
        if month == 0:
            year, month = year - 1, 12
        starts.append(dt.datetime(year, month, 1, tzinfo=dt.UTC))
        month += 1
        if month == 13:
            year, month = year + 1, 1
    return [
        (f"p{a:%Y%m}", _uuid7_floor(a), _uuid7_floor(b))
        for a, b in itertools.pairwise(starts)
    ]


_IDLE_TENANT: Final = "00000000-0000-0000-0000-00000000abcd"
_IDLE_ROWS: Final = 5000


def ledger_ddl(role: str) -> str:
    """The schemas of the ledger's steps, usable by ``role`` (the app role)."""
    parts = []
    for number, _step in enumerate(LEDGER_STEPS):
        schema = f"ledger_{number}"
        chain, part = number >= 3, number >= 5
        event_pk = "" if part else " PRIMARY KEY"
        parts.append(f"""
DROP SCHEMA IF EXISTS {schema} CASCADE;
CREATE SCHEMA {schema};
CREATE TABLE {schema}.task (
    id uuid PRIMARY KEY, tenant_id uuid NOT NULL, state varchar(20) NOT NULL,
    state_version integer NOT NULL, current_step varchar(200) NOT NULL DEFAULT '',
    reason_code varchar(40), wake_at timestamptz, lease_owner text,
    lease_token bigint NOT NULL DEFAULT 0, lease_expires_at timestamptz,
    created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL
);
CREATE INDEX ON {schema}.task (tenant_id, created_at, id) WHERE state = 'pending';
CREATE TABLE {schema}.agent_grant (
    tenant_id uuid NOT NULL, agent_id uuid NOT NULL, action text NOT NULL,
    target text NOT NULL, PRIMARY KEY (tenant_id, agent_id, action, target)
);
CREATE TABLE {schema}.operation (
    id uuid PRIMARY KEY, tenant_id uuid NOT NULL, task_id uuid NOT NULL,
    idempotency_key text NOT NULL, action text NOT NULL, target text NOT NULL,
    input_hash text NOT NULL, input jsonb NOT NULL, state text NOT NULL,
    created_at timestamptz NOT NULL, UNIQUE (tenant_id, idempotency_key)
);
CREATE TABLE {schema}.event (
    id uuid NOT NULL{event_pk}, tenant_id uuid NOT NULL, task_id uuid NOT NULL,
    code text NOT NULL, payload jsonb NOT NULL, payload_digest text,
    chain_seq bigint, prev_hash text, hash text, created_at timestamptz NOT NULL
){" PARTITION BY RANGE (id)" if part else ""};
CREATE TABLE {schema}.chainhead (
    tenant_id uuid NOT NULL, task_id uuid NOT NULL, head_seq bigint NOT NULL,
    head_hash text, PRIMARY KEY (tenant_id, task_id)
);
CREATE TABLE {schema}.outbox (
    id uuid PRIMARY KEY, tenant_id uuid NOT NULL, event_id uuid NOT NULL,
    task_id uuid NOT NULL, envelope jsonb NOT NULL,
    state text NOT NULL DEFAULT 'pending', created_at timestamptz NOT NULL
);""")
        if part:
            parts.append(f"ALTER TABLE {schema}.event ADD PRIMARY KEY (id);")
            for name, low, high in _month_bounds(4):
                parts.append(
                    f"CREATE TABLE {schema}.event_{name} PARTITION OF {schema}.event"
                    f" FOR VALUES FROM ('{low}') TO ('{high}');"
                )
        if chain:  # a chain is a line (unique per month partition in the services)
            unique = "" if part else "UNIQUE "
            parts.append(
                f"CREATE {unique}INDEX ON {schema}.event"
                " (tenant_id, task_id, chain_seq);"
            )
        # Rows of a tenant no client is in, analysed: a table the planner sees as
        # empty gets a sequential-scan plan that psycopg's prepared statement then
        # keeps while the clients fill it (the services' tables are never empty).
        parts.append(f"""
INSERT INTO {schema}.task (id, tenant_id, state, state_version, created_at, updated_at)
SELECT gen_random_uuid(), '{_IDLE_TENANT}', 'succeeded', 2, now(), now()
FROM generate_series(1, {_IDLE_ROWS});
INSERT INTO {schema}.chainhead (tenant_id, task_id, head_seq)
SELECT tenant_id, id, 0 FROM {schema}.task;
ANALYZE {schema}.task, {schema}.chainhead;""")
        if number >= 1:
            tables: tuple[str, ...] = ("task", "agent_grant", "operation")
            tables += ("event", "chainhead", "outbox")
            parts.extend(
                f"ALTER TABLE {schema}.{table} ENABLE ROW LEVEL SECURITY;"
                f" CREATE POLICY scope ON {schema}.{table} USING (tenant_id = ANY"
                " ((SELECT portal_tenant_scope())::uuid[]));"
                for table in tables
            )
        if number >= 2:
            parts.append(
                f"CREATE TRIGGER guard BEFORE UPDATE ON {schema}.task"
                " FOR EACH ROW EXECUTE FUNCTION tasks_task_guard_update();"
            )
        parts.append(
            f"GRANT USAGE ON SCHEMA {schema} TO {role};"
            f" GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema}"
            f" TO {role};"
        )
    return "\n".join(parts)


def setup_procrastinate(url: str) -> str:
    from bench.peer_apps import procrastinate_app

    app = procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()
    return url


def setup_dbos(url: str) -> str:
    """Launch DBOS once here, so its system tables exist before the clients start."""
    from dbos import DBOS

    from bench.peer_apps import dbos_workflow

    assert dbos_workflow(url)(1) == 2
    DBOS.destroy()
    return url


# --- Runs ----------------------------------------------------------------------------


def make_spec(
    raw: psycopg.Connection[Any],
    *,
    tag: str,
    workload: str,
    flavour: str,
    clients: int,
    args: argparse.Namespace,
    peer_url: str,
) -> RunSpec:
    if flavour in ("service", "raw") and workload != "lifecycle":
        spec = prepare(
            raw, tag=tag, workload=workload, flavour=flavour, clients=clients, args=args
        )
        return dataclasses.replace(spec, peer_url=peer_url)
    from bench.workloads import make_tenant

    tenant, agent = make_tenant(f"peers-{tag}-{workload}-{clients}-{flavour}")
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
        refill_batch=1000,
        peer_url=peer_url,
    )


def check_lean(raw: psycopg.Connection[Any], spec: RunSpec, done: int) -> None:
    row = raw.execute(
        "SELECT (SELECT count(*) FROM lean.event WHERE tenant_id = %(t)s),"
        " (SELECT count(*) FROM lean.outbox WHERE tenant_id = %(t)s)",
        {"t": uuid.UUID(spec.tenant_id)},
    ).fetchone()
    per_op = 2 if spec.workload == "claim" else 1
    if row != (per_op * done, per_op * done):
        raise AssertionError(f"{spec.run_id}: (events, outbox) {row}, done {done}")


def check_ledger(raw: psycopg.Connection[Any], spec: RunSpec, done: int) -> None:
    """Each operation of a ledger step wrote its event (and its outbox row, from the
    outbox step on), in the step's own schema."""
    from bench.workloads import raw_scope  # after django.setup()

    raw_scope(raw, spec.tenant_id)  # row-level security, from the second step on
    number = LEDGER_FLAVOURS.index(spec.flavour)
    row = raw.execute(
        f"SELECT (SELECT count(*) FROM ledger_{number}.event WHERE tenant_id = %(t)s),"
        f" (SELECT count(*) FROM ledger_{number}.outbox WHERE tenant_id = %(t)s)",
        {"t": uuid.UUID(spec.tenant_id)},
    ).fetchone()
    if row != (done, done if number >= 4 else 0):
        raise AssertionError(f"{spec.run_id}: (events, outbox) {row}, done {done}")


def check_lifecycle(raw: psycopg.Connection[Any], spec: RunSpec, done: int) -> None:
    from bench.workloads import raw_scope  # after django.setup()

    raw_scope(raw, spec.tenant_id)  # row-level security: the run's tenant
    row = raw.execute(
        "SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*)"
        " FROM tasks_task WHERE tenant_id = %s",
        [uuid.UUID(spec.tenant_id)],
    ).fetchone()
    if row != (done, done):
        raise AssertionError(f"{spec.run_id}: (succeeded, tasks) {row}, done {done}")


def measure(
    clients: Clients,
    raw: psycopg.Connection[Any],
    *,
    tag: str,
    workload: str,
    count: int,
    args: argparse.Namespace,
    peer_urls: dict[str, str],
) -> list[report.RunSummary]:
    flavours = args.flavours[workload]
    specs = {
        flavour: make_spec(
            raw,
            tag=tag,
            workload=workload,
            flavour=flavour,
            clients=count,
            args=args,
            peer_url=peer_urls.get(flavour, ""),
        )
        for flavour in flavours
    }
    tidy(raw)
    rounds: dict[str, list[list[ClientResult]]] = {f: [] for f in flavours}
    for number in range(args.rounds):
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
        say(f"    {workload} clients={count} round {number + 1}: {', '.join(figures)}")
    summaries = []
    for flavour in flavours:
        results = [r for round_ in rounds[flavour] for r in round_]
        done = sum(r.ops + r.warmup_ops for r in results)
        if flavour == "lean":
            check_lean(raw, specs[flavour], done)
        elif flavour in LEDGER_FLAVOURS:
            check_ledger(raw, specs[flavour], done)
        elif flavour == "service" and workload == "lifecycle":
            check_lifecycle(raw, specs[flavour], done)
        elif flavour in ("service", "raw"):
            verify(raw, specs[flavour], results)
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


# --- Report --------------------------------------------------------------------------


def _find(
    summaries: Sequence[report.RunSummary], workload: str, flavour: str, clients: int
) -> report.RunSummary | None:
    for summary in summaries:
        if (summary.workload, summary.flavour, summary.clients) == (
            workload,
            flavour,
            clients,
        ):
            return summary
    return None


def _cpu(summary: report.RunSummary) -> str:
    return f"{summary.cpu_us_per_op:,.0f} + {summary.server_cpu_us_per_op:,.0f}"


def table(summaries: Sequence[report.RunSummary], client_counts: Sequence[int]) -> str:
    lines = [
        "| work | clients | ours ops/s | peer ops/s | **ours / peer** | per round"
        " | aim | ours p50 / p99 ms | peer p50 / p99 ms"
        " | CPU µs/op ours (client + server) | peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload, ours, peer, aim, label in ROWS:
        for clients in client_counts:
            a = _find(summaries, workload, ours, clients)
            b = _find(summaries, workload, peer, clients)
            if a is None or b is None or b.ops_per_s == 0:
                continue
            ratio = a.ops_per_s / b.ops_per_s
            per_round = report.round_ratios(a, b)
            span = (
                f"{min(per_round) / 100:.2f}-{max(per_round) / 100:.2f}"
                if per_round
                else "-"
            )
            if not aim:
                aim_text = "-"
            else:
                aim_text = f">= {aim:g}x" if aim >= 1 else f">= {aim:.0%}"
            shown = f"{ratio:.2f}x" if aim >= 1 or not aim else f"{ratio:.0%}"
            lines.append(
                f"| {label} | {clients} | {a.ops_per_s:,.0f} | {b.ops_per_s:,.0f}"
                f" | **{shown}** | {span} | {aim_text}"
                f" | {a.p50_ms:.2f} / {a.p99_ms:.2f} | {b.p50_ms:.2f} / {b.p99_ms:.2f}"
                f" | {_cpu(a)} | {_cpu(b)} |"
            )
    return "\n".join(lines)


def run_side_benchmarks(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Run bench/api.py and bench/relay.py as this command's part; their figures."""
    wanted = [w for w in args.also.split(",") if w]
    unknown = set(wanted) - set(SIDE_BENCHMARKS)
    if unknown:
        raise SystemExit(f"--also: unknown {sorted(unknown)}")
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        for which in wanted:
            out = Path(folder) / f"{which}.json"
            database = f"{name}_{which}"
            url = urllib.parse.urlsplit(args.database_url)._replace(path=f"/{database}")
            if which == "rest":
                command = [
                    "bench/api.py", "--workloads", "reservation",
                    "--clients", args.rest_clients, "--duration", f"{args.duration:g}",
                    "--rounds", str(args.rounds),
                ]  # fmt: skip
            elif which == "doors":
                command = ["bench/doors.py", "--clients", "1,8"]
            else:
                command = [
                    "bench/relay.py", "--relays", "1,4",
                    "--rate", f"{args.relay_rate:g}", "--duration", "5",
                ]  # fmt: skip
            say(f"peers: {which}: {shlex.join(command)}")
            subprocess.run(
                [sys.executable, *command, "--no-docs", "--json", str(out),
                 "--database-url", url.geturl()],
                cwd=REPO, check=True,
            )  # fmt: skip
            figures[which] = json.loads(out.read_text())
            _recreate(args.database_url, database, drop_only=True)
    return figures


def side_table(figures: dict[str, Any]) -> str:
    """The REST and relay rows of the issue, with their aims."""
    lines = [
        "| work | clients / relays | ours | baseline | **ratio** | aim"
        " | ours p50 / p99 ms | baseline p50 / p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rest = figures.get("rest")
    if rest:
        runs = {(r["flavour"], r["clients"]): r for r in rest["runs"]}
        counts = sorted({clients for _, clients in runs})
        for clients in counts:
            api, raw = runs.get(("api", clients)), runs.get(("raw", clients))
            if not api or not raw or not raw["ops_per_s"]:
                continue
            aim = f">= {REST_AIM:.0%}"
            if clients == counts[-1]:
                aim += f", p99 < {REST_P99_AIM_MS:g} ms"
            lines.append(
                f"| REST reserve, keep-alive clients ({rest['meta']['workers']})"
                f" vs raw SQL reservation | {clients}"
                f" | {api['ops_per_s']:,.0f}/s | {raw['ops_per_s']:,.0f}/s"
                f" | **{api['ops_per_s'] / raw['ops_per_s']:.0%} of raw** | {aim}"
                f" | {api['p50_ms']:.2f} / {api['p99_ms']:.2f}"
                f" | {raw['p50_ms']:.2f} / {raw['p99_ms']:.2f} |"
            )
            close = runs.get(("close", clients))
            if close:
                lines.append(
                    f"| REST reserve, `Connection: close` clients vs raw SQL"
                    f" | {clients} | {close['ops_per_s']:,.0f}/s"
                    f" | {raw['ops_per_s']:,.0f}/s"
                    f" | {close['ops_per_s'] / raw['ops_per_s']:.0%} of raw | -"
                    f" | {close['p50_ms']:.2f} / {close['p99_ms']:.2f}"
                    f" | {raw['p50_ms']:.2f} / {raw['p99_ms']:.2f} |"
                )
    doors = figures.get("doors")
    if doors:
        flows = doors["flows"]
        lines.append(
            f"| one-call action (`POST /api/v1/actions`) vs the six-call lifecycle"
            f" (actions/s, each a real ticket) | 1 | {flows['one_call_per_s']:.1f}/s"
            f" | {flows['six_calls_per_s']:.1f}/s | **{flows['ratio']:.2f}x**"
            f" | >= {ONE_CALL_AIM:g}x | - | - |"
        )
        for row in doors["latency"]:
            adds = row["mcp_p50_ms"] - row["rest_p50_ms"]
            lines.append(
                f"| MCP tool call vs the REST one call (ms; ratio column: MCP adds"
                f" at p50) | {row['clients']} | {row['mcp_p50_ms']:.1f} p50"
                f" | {row['rest_p50_ms']:.1f} p50 | **{adds:+.1f} ms**"
                f" | < {MCP_ADDS_AIM_MS:g} ms"
                f" | {row['mcp_p50_ms']:.1f} / {row['mcp_p99_ms']:.1f}"
                f" | {row['rest_p50_ms']:.1f} / {row['rest_p99_ms']:.1f} |"
            )
        cpu = doors["cpu_ms_per_action"]
        rest_ms = cpu["rest"]["web_ms"] + cpu["rest"]["mcp_ms"]
        mcp_ms = cpu["mcp"]["web_ms"] + cpu["mcp"]["mcp_ms"]
        lines.append(
            f"| server CPU per action, MCP door vs REST one call (ms, web + MCP"
            f" processes, the object-version PUT included) | 1 | {mcp_ms:.1f}"
            f" | {rest_ms:.1f} | {mcp_ms - rest_ms:+.1f} ms | - | - | - |"
        )
    relay = figures.get("relay")
    if relay:
        for count, got in sorted(relay["relay"].items(), key=lambda kv: int(kv[0])):
            raw = relay["raw_sql"].get(count, {}).get("rows_per_s", 0.0)
            lines.append(
                f"| relay with publisher confirms (events/s; baseline: its raw SQL"
                f" claim + mark, no broker) | {count} | {got['rows_per_s']:,.0f}/s"
                f" | {raw:,.0f}/s | **{got['rows_per_s'] / RELAY_AIM:.2f}x the aim**"
                f" | >= {RELAY_AIM:,.0f}/s | - | - |"
            )
        broker = relay.get("broker_only", {})
        for count, got in sorted(broker.items(), key=lambda kv: int(kv[0])):
            lines.append(
                f"| the relay's publisher alone, no database (msgs/s; the broker's"
                f" ceiling here) | {count} | {got['rows_per_s']:,.0f}/s | -"
                f" | {got['rows_per_s'] / RELAY_AIM:.2f}x the aim | - | - | - |"
            )
        steady = relay["steady"]
        lines.append(
            f"| relay: commit → publish lag at {steady['rate']:,.0f} events/s offered"
            f" ({steady.get('achieved_per_s', 0):,.0f}/s achieved;"
            f" {steady['published']:,} published of {steady['written']:,}) | 1 | - | -"
            f" | - | p99 < {RELAY_LAG_AIM_MS:g} ms"
            f" | {steady['lag_p50_ms']:.1f} / {steady['lag_p99_ms']:.1f} | - |"
        )
    return "\n".join(lines)


def ledger_table(
    summaries: Sequence[report.RunSummary], client_counts: Sequence[int]
) -> str:
    """Per workload and client count, each step's CPU per operation and what it adds
    to the step before it (the last row: the services over the last step)."""
    lines = [
        "| work | clients | step | ops/s | CPU µs/op client | CPU µs/op backend"
        " | adds: client | adds: backend |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    labels = {
        **LEDGER_LABELS,
        "raw": "the services' statements, raw psycopg, on the services' schema",
        "service": "the services (tasks/services/)",
    }
    for workload in LEDGER_WORKLOADS:
        for clients in client_counts:
            before: report.RunSummary | None = None
            for flavour in LEDGER_ROWS:
                got = _find(summaries, workload, flavour, clients)
                if got is None:
                    continue
                adds = ("-", "-")
                if before is not None:
                    client = got.cpu_us_per_op - before.cpu_us_per_op
                    backend = got.server_cpu_us_per_op - before.server_cpu_us_per_op
                    adds = (f"{client:+,.0f}", f"{backend:+,.0f}")
                lines.append(
                    f"| {workload} | {clients} | {labels[flavour]}"
                    f" | {got.ops_per_s:,.0f} | {got.cpu_us_per_op:,.0f}"
                    f" | {got.server_cpu_us_per_op:,.0f} | {adds[0]} | {adds[1]} |"
                )
                before = got
    return "\n".join(lines)


def ledger_markdown(
    meta: dict[str, Any], summaries: Sequence[report.RunSummary]
) -> str:
    load = meta["load_average_1m"]
    return f"""## The guarantee-cost ledger: what each guarantee costs

Generated by `bench/peers.py --ledger` on {meta["date"]} (run took
{meta["wall_s"]:.0f} s, code at `{meta["commit"]}`); do not edit between the
markers, run the command again:

```
{meta["command"]}
```

- {meta["nproc"]} CPUs, 1-minute load average {load[0]} → {load[1]} (start → end).
  PostgreSQL {meta["postgres_version"]}; Python {meta["python_version"]}.
- Each step is the lean baseline (one statement per operation, plain psycopg,
  prepared) with the guarantees of the steps above it and its own, in its own
  schema (`bench/peer_runners.py`, `LEDGER_STEPS`). The last two rows are the
  services' own statements sent by raw psycopg on the services' schema (their
  indexes, CHECK constraints, foreign keys, triggers and wider rows, no Django:
  `bench/workloads.py`'s raw flavour), then the services (their Python too).
  All run in the same interleaved slices, {meta["duration_s"]:g} s per step and
  client count in {meta["rounds"]} rounds. "Adds" is the row's CPU per operation
  less the row above: what that guarantee, the schema or the Python costs.

{ledger_table(summaries, meta["clients"])}
"""


def markdown(meta: dict[str, Any], summaries: Sequence[report.RunSummary]) -> str:
    load = meta["load_average_1m"]
    return f"""## Against the peers: DBOS Transact, Procrastinate, a lean baseline

Generated by `bench/peers.py` on {meta["date"]} (run took {meta["wall_s"]:.0f} s,
code at `{meta["commit"]}`); do not edit between the markers, run the command again
(the peers come with the `bench` extra: `.venv/bin/pip install -e '.[bench]' -c
constraints.txt`):

```
{meta["command"]}
```

- {meta["nproc"]} CPUs, 1-minute load average {load[0]} → {load[1]} (start → end;
  the machine is shared, so compare the columns of one run).
  PostgreSQL {meta["postgres_version"]}; Python {meta["python_version"]};
  {meta["peers"]}.
- The clients are `bench/run.py`'s: separate processes released together by a
  barrier, each flavour {meta["duration_s"]:g} s per client count in
  {meta["rounds"]} slices alternated with the others' in rotating order. "Per round"
  is the range of the per-slice ratios. CPU per operation: the client process's,
  then its PostgreSQL backends'.
- Ours: the services as the app role in the tenant's scope, prepared statements on
  (the settings' defaults). DBOS Transact: a workflow of one step, called
  synchronously, system database `<name>_dbos`. Procrastinate: jobs deferred
  beforehand (untimed), then per operation what its worker does per job
  (`fetch_job`, the task, `finish_job`), database `<name>_procrastinate`. Lean:
  `bench/lean.sql`, one statement per state change over plain psycopg
  (`bench/peer_runners.py`).

{table(summaries, meta["clients"])}
{_side_section(meta)}"""


def _side_section(meta: dict[str, Any]) -> str:
    figures = meta.get("side") or {}
    if not figures:
        return ""
    rest = figures.get("rest", {}).get("meta", {})
    relay = figures.get("relay", {}).get("meta", {})
    doors = figures.get("doors", {}).get("meta", {})
    parts = []
    if rest:
        parts.append(
            f"REST: `bench/api.py` run by this command (gunicorn from"
            f" `gunicorn.conf.py`: {rest.get('workers')};"
            f" {rest.get('duration_s'):g} s per flavour and client count"
            f" in {rest.get('rounds')} alternated slices; the baseline is the same"
            " reservation in raw SQL)"
        )
    if doors:
        parts.append(
            "doors: `bench/doors.py` run by this command (`manage.py up"
            " --no-worker` with `DJANGO_DEBUG=0` on its own database, the real"
            f" ticket desk; {doors.get('actions')} actions per flow,"
            f" {doors.get('mcp_actions')} per client and door for MCP; each client"
            " its own process)"
        )
    if relay:
        parts.append(
            f"relay: `bench/relay.py` run by this command (a backlog of"
            f" {relay.get('rows'):,} rows drained with publisher confirms to"
            f" RabbitMQ, batch {relay.get('batch')}; several relays are"
            f" {relay.get('relays_as', 'threads')} as Celery runs them; the lag's"
            " load comes from writer processes, several events per commit)"
        )
    return (
        "\nThe issue's other rows, in the same run: "
        + "; ".join(parts)
        + ".\n\n"
        + side_table(figures)
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.monotonic()
    admin_url = args.database_url
    name = str(psycopg.conninfo.conninfo_to_dict(admin_url).get("dbname", ""))
    say(f"peers: recreating and migrating {name}")
    app_url = recreate_database(admin_url, seed=True)
    setup_lean(admin_url, app_url, ledger=args.ledger)
    peer_urls = {}
    if "procrastinate" in {f for w in args.workload_list for f in args.flavours[w]}:
        peer_urls["procrastinate"] = setup_procrastinate(
            _recreate(admin_url, f"{name}_procrastinate")
        )
    if "lifecycle" in args.workload_list:
        peer_urls["dbos"] = setup_dbos(_recreate(admin_url, f"{name}_dbos"))

    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("PORTAL_DEV_MODE", "1")
    os.environ["DATABASE_URL"] = app_url
    import django

    django.setup()
    from django.db import connection

    from bench.workloads import connect_raw

    raw = connect_raw(app_url)
    postgres_version, _ = server_facts(raw)
    tag = uuid.uuid4().hex[:8]
    clients = Clients(max(args.client_counts), args.client_counts, app_url)
    summaries: list[report.RunSummary] = []
    load_before = os.getloadavg()
    try:
        for workload in args.workload_list:
            say(f"peers: {workload}")
            for n in args.client_counts:
                summaries += measure(
                    clients,
                    raw,
                    tag=tag,
                    workload=workload,
                    count=n,
                    args=args,
                    peer_urls=peer_urls,
                )
                connection.close()
    finally:
        clients.stop()
        raw.close()
        for peer in ("procrastinate", "dbos"):
            _recreate(admin_url, f"{name}_{peer}", drop_only=True)
    side = run_side_benchmarks(args, name)
    load_after = os.getloadavg()
    from importlib.metadata import PackageNotFoundError, version

    def installed(package: str) -> str:
        # --ledger measures no peer: its smoke test runs without the bench extra.
        try:
            return f"{package} {version(package)}"
        except PackageNotFoundError:
            return f"{package} (not installed)"

    commit = os.popen(f"git -C {shlex.quote(str(REPO))} rev-parse --short HEAD").read()
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join([".venv/bin/python", "bench/peers.py", *argv]),
        "commit": commit.strip(),
        "nproc": len(os.sched_getaffinity(0)),
        "platform": f"{platform.system()} {platform.machine()}",
        "postgres_version": postgres_version,
        "python_version": platform.python_version(),
        "peers": ", ".join(
            installed(p) for p in ("procrastinate", "dbos", "psycopg", "django")
        ),
        "duration_s": args.duration,
        "rounds": args.rounds,
        "clients": args.client_counts,
        "load_average_1m": [round(load_before[0], 1), round(load_after[0], 1)],
        "wall_s": round(time.monotonic() - started, 1),
        "side": side,
    }
    say("")
    if args.ledger:
        say(ledger_table(summaries, args.client_counts))
    else:
        say(table(summaries, args.client_counts))
    if side:
        say(side_table(side))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"meta": meta, "runs": [s.as_json() for s in summaries]}, indent=2)
        + "\n"
    )
    if not args.no_docs and args.ledger:
        report.replace_section(
            DOCS, ledger_markdown(meta, summaries), section=LEDGER_SECTION
        )
        say(f"peers: updated {DOCS.relative_to(REPO)}")
    elif not args.no_docs:
        report.replace_section(DOCS, markdown(meta, summaries), section=SECTION)
        say(f"peers: updated {DOCS.relative_to(REPO)}")
    say(f"peers: done in {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
