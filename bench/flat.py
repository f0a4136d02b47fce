"""Flat with size (issue 11): the service layer on empty tables against the same
runs on tables holding 1M tasks and 10M events, in alternating runs of bench/run.py.

    .venv/bin/python bench/flat.py [--tasks 1000000] [--events 10000000] [--pairs 2]
        [--workloads transition,claim] [--clients 1,4] [--duration 5] [--rounds 5]
        [--empty-url postgres://postgres@127.0.0.1:5432/portal_bench_flat_empty]
        [--scale-url postgres://postgres@127.0.0.1:5432/portal_bench_flat_scale]
        [--load-only] [--no-docs]

The scale database is made once: ``manage.py load_scale_data`` fills it (about 12 min
and 23 GB at the defaults, all through COPY with every constraint and trigger on),
then one ``VACUUM (ANALYZE)`` sets its statistics and visibility map. Later runs reuse
it when it holds at least ``--tasks`` tasks and ``--events`` events; after an
interrupted load they top it up. Each pair runs
``bench/run.py`` once on a freshly made empty database and once on the scale database
(``--reuse``: its rows stay, the benchmark adds its own tenants beside them); the order
alternates from pair to pair, so drift of the machine hits both sides alike.

The table compares medians over the pairs: operations per second, p99 latency and
client + server CPU per operation, scale against empty. The aim is within 15 %.
Figures go to docs/performance.md (between this benchmark's markers; not with
``--no-docs``) and reports/bench-flat.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import psycopg  # noqa: E402

from bench.report import replace_section  # noqa: E402
from bench.service_layer import recreate_database  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "performance.md"
JSON_REPORT = REPO / "reports" / "bench-flat.json"
SECTION = "flat-with-size"
SERVER = "postgres://postgres@127.0.0.1:5432"
AIM = 0.15


def say(message: str) -> None:
    print(message, flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/flat.py", description=__doc__)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--pairs", type=int, default=2, help="empty/scale run pairs")
    parser.add_argument("--workloads", default="transition,claim")
    parser.add_argument("--clients", default="1,4")
    parser.add_argument("--duration", default="5")
    parser.add_argument("--rounds", default="5")
    parser.add_argument("--empty-url", default=f"{SERVER}/portal_bench_flat_empty")
    parser.add_argument("--scale-url", default=f"{SERVER}/portal_bench_flat_scale")
    parser.add_argument(
        "--load-only", action="store_true", help="make the scale database, then stop"
    )
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--json", type=Path, default=JSON_REPORT)
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    return args


def held(admin_url: str) -> tuple[int, int] | None:
    """(tasks, events) in the database, or None when it does not exist or is empty.

    The administrator is a superuser, so row-level security does not hide rows.
    """
    name = psycopg.conninfo.conninfo_to_dict(admin_url)["dbname"]
    server = psycopg.conninfo.make_conninfo(admin_url, dbname="postgres")
    with psycopg.connect(server, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if not found.fetchone():
            return None
    with psycopg.connect(admin_url, autocommit=True) as conn:
        table = conn.execute("SELECT to_regclass('tasks_task')").fetchone()
        if table is None or table[0] is None:
            return None
        row = conn.execute(
            "SELECT (SELECT count(*) FROM tasks_task),"
            " (SELECT count(*) FROM audit_event)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def load_scale(args: argparse.Namespace, *, resume: bool) -> None:
    """Make the scale database (or, ``resume``, keep what an interrupted load left:
    the loader tops it up) and fill it, then vacuum and analyse it once."""
    verb = "topping up" if resume else "making"
    say(
        f"flat: {verb} {args.scale_url.rsplit('/', 1)[-1]} to "
        f"{args.tasks:,} tasks and {args.events:,} events (about 12 min at 1M/10M)"
    )
    app_url = recreate_database(args.scale_url, keep_rows=resume)
    env = {
        **os.environ,
        "DATABASE_URL": app_url,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PORTAL_NO_BOOTSTRAP": "1",
        "PORTAL_DEV_MODE": "1",
    }
    subprocess.run(
        [sys.executable, "manage.py", "load_scale_data", "--tasks", str(args.tasks),
         "--events", str(args.events), "--tenants", "20"],
        cwd=REPO, env=env, check=True,
    )  # fmt: skip
    say("flat: VACUUM (ANALYZE) of the loaded database")
    with psycopg.connect(args.scale_url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


def run_once(args: argparse.Namespace, side: str, out: Path) -> dict[str, Any]:
    """One bench/run.py on one side; its JSON report."""
    url = args.scale_url if side == "scale" else args.empty_url
    command = [
        sys.executable, "bench/run.py", "--no-docs", "--json", str(out),
        "--database-url", url, "--workloads", args.workloads,
        "--clients", args.clients, "--duration", args.duration, "--rounds", args.rounds,
    ] + (["--reuse"] if side == "scale" else [])  # fmt: skip
    say(f"flat: {side}: {shlex.join(command[1:])}")
    subprocess.run(command, cwd=REPO, check=True)
    return json.loads(out.read_text())


def _median(sides: dict[str, list[dict[str, Any]]], side: str, field: str) -> float:
    return float(statistics.median(run[field] for run in sides[side]))


def _cpu(sides: dict[str, list[dict[str, Any]]], side: str) -> float:
    """Client + server CPU per operation."""
    return _median(sides, side, "cpu_us_per_op") + _median(
        sides, side, "server_cpu_us_per_op"
    )


def compare(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per workload, flavour and client count: medians on each side and the ratio."""
    keyed: dict[tuple[str, str, int], dict[str, list[dict[str, Any]]]] = {}
    for side, reports in runs.items():
        for report in reports:
            for run in report["runs"]:
                key = (run["workload"], run["flavour"], run["clients"])
                keyed.setdefault(key, {"empty": [], "scale": []})[side].append(run)
    rows = []
    for (workload, flavour, clients), sides in sorted(keyed.items()):
        empty, scale = (
            _median(sides, "empty", "ops_per_s"),
            _median(sides, "scale", "ops_per_s"),
        )
        rows.append({
            "workload": workload, "flavour": flavour, "clients": clients,
            "empty_ops_per_s": empty, "scale_ops_per_s": scale,
            "ratio": scale / empty if empty else 0.0,
            "empty_p99_ms": _median(sides, "empty", "p99_ms"),
            "scale_p99_ms": _median(sides, "scale", "p99_ms"),
            "empty_cpu_us": _cpu(sides, "empty"), "scale_cpu_us": _cpu(sides, "scale"),
            "empty_rounds": [round(r["ops_per_s"]) for r in sides["empty"]],
            "scale_rounds": [round(r["ops_per_s"]) for r in sides["scale"]],
        })  # fmt: skip
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| workload | flavour | clients | empty ops/s | scale ops/s | scale/empty"
        " | p99 ms empty / scale | CPU µs/op empty / scale | runs (ops/s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row["ratio"]
        mark = "**" if ratio < 1 - AIM else ""
        lines.append(
            f"| {row['workload']} | {row['flavour']} | {row['clients']}"
            f" | {row['empty_ops_per_s']:,.0f} | {row['scale_ops_per_s']:,.0f}"
            f" | {mark}{ratio:.2f}{mark}"
            f" | {row['empty_p99_ms']:.2f} / {row['scale_p99_ms']:.2f}"
            f" | {row['empty_cpu_us']:,.0f} / {row['scale_cpu_us']:,.0f}"
            f" | {row['empty_rounds']} / {row['scale_rounds']} |"
        )
    return "\n".join(lines)


def markdown(meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    services = [r for r in rows if r["flavour"] == "service"]
    worst = min(services, key=lambda r: r["ratio"]) if services else None
    verdict = (
        f"The services' worst row is {worst['workload']} at {worst['clients']}"
        f" client(s): {worst['ratio']:.2f} of empty,"
        f" {'within' if worst['ratio'] >= 1 - AIM else 'outside'} the aim of 15 %."
        if worst
        else ""
    )
    return f"""## Flat with size: 1M tasks and 10M events against empty tables

Generated by `bench/flat.py` on {meta["date"]} (run took {meta["wall_s"]:.0f} s, code
at `{meta["commit"]}`, load average {meta["load"]}); do not edit between the markers,
run the command again:

```
{meta["command"]}
```

Each pair runs `bench/run.py` once on a freshly made empty database and once on the
scale database (`--reuse`), the order alternating from pair to pair; the table gives
medians over {meta["pairs"]} pair(s). The scale database holds {meta["scale_tasks"]:,}
tasks and {meta["scale_events"]:,} events (`manage.py load_scale_data`, 20 tenants);
the benchmark's own tenants sit beside them, so every index and foreign key the
services touch is the big one. Bold: more than 15 % slower. {verdict}

{table(rows)}
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    have = held(args.scale_url)
    if have is None or have[0] < args.tasks or have[1] < args.events:
        load_scale(args, resume=have is not None)
        have = held(args.scale_url)
    assert have is not None
    say(f"flat: the scale database holds {have[0]:,} tasks and {have[1]:,} events")
    if args.load_only:
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"empty": [], "scale": []}
    with tempfile.TemporaryDirectory() as folder:
        for pair in range(args.pairs):
            order = ("empty", "scale") if pair % 2 == 0 else ("scale", "empty")
            for side in order:
                out = Path(folder) / f"{side}-{pair}.json"
                runs[side].append(run_once(args, side, out))
    rows = compare(runs)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
        text=True, check=False,
    ).stdout.strip()  # fmt: skip
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join([".venv/bin/python", "bench/flat.py", *argv]),
        "commit": commit or "?",
        "load": f"{load_before:.1f} → {os.getloadavg()[0]:.1f}",
        "pairs": args.pairs,
        "scale_tasks": have[0],
        "scale_events": have[1],
        "wall_s": time.monotonic() - started,
    }
    say("")
    say(table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    say(f"\nflat: wrote {args.json}")
    if not args.no_docs:
        replace_section(DOCS, markdown(meta, rows), section=SECTION)
        say(f"flat: updated {DOCS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
