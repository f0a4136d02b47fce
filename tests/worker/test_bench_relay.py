"""Smoke test of bench/relay.py at a tiny size, against the real broker and its own
throwaway database: every phase drains what it was given, the steady load's rows are
all published, and the CPU figures are there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]
ROWS = 60


def run_relay_bench(*args: str, tmp_path: Path) -> dict:
    """``bench/relay.py`` with ``args`` on a throwaway database of its own (dropped
    afterwards); its JSON report."""
    base = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    name = f"portal_bench_relay_smoke_{uuid.uuid4().hex[:8]}"
    url = base._replace(path=f"/{name}").geturl()
    out = tmp_path / "relay.json"
    try:
        subprocess.run(
            [sys.executable, "bench/relay.py", *args, "--database-url", url,
             "--no-docs", "--json", str(out)],
            cwd=REPO, check=True, timeout=600,
        )  # fmt: skip
    finally:
        maintenance = base._replace(path="/postgres").geturl()
        with psycopg.connect(maintenance, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)
                )
            )
    return json.loads(out.read_text())


def test_the_relay_bench_runs_every_phase_at_a_tiny_size(amqp_url: str, tmp_path: Path):
    figures = run_relay_bench(
        "--rows", str(ROWS), "--relays", "1,2", "--rate", "80", "--writers", "2",
        "--per-commit", "2", "--duration", "1", "--broker", amqp_url,
        tmp_path=tmp_path,
    )  # fmt: skip

    for phase in ("raw_sql", "relay", "broker_only"):
        for count in ("1", "2"):
            got = figures[phase][count]
            assert got["rows"] == ROWS, (phase, count, got)
            assert got["rows_per_s"] > 0
            assert got["client_cpu_us_per_row"] > 0
    # A backend's CPU time is counted in clock ticks (10 ms): at this size it can
    # read zero, so the smoke test asks only that the figure is there.
    assert figures["relay"]["1"]["server_cpu_us_per_row"] >= 0
    steady = figures["steady"]
    assert steady["written"] > 0
    assert steady["published"] == steady["written"]  # nothing left behind
    assert (steady["writers"], steady["per_commit"]) == (2, 2)
    assert steady["lag_p99_ms"] >= steady["lag_p50_ms"] > 0


def test_the_fillfactor_comparison_alternates_and_fills_pages_as_told(
    amqp_url: str, tmp_path: Path
):
    drains = run_relay_bench(
        "--fillfactor", "45,100", "--rounds", "2", "--rows", "40", "--relays", "1",
        "--broker", amqp_url, tmp_path=tmp_path,
    )["fillfactor"]  # fmt: skip

    # A B, then B A; the raw SQL and the relay each drain a fresh backlog
    order = [(d["fillfactor"], d["kind"]) for d in drains]
    assert order == [
        (45, "raw_sql"), (45, "relay"), (100, "raw_sql"), (100, "relay"),
        (100, "raw_sql"), (100, "relay"), (45, "raw_sql"), (45, "relay"),
    ]  # fmt: skip
    assert all(d["rows"] == 40 for d in drains)
    # Each drain starts from an empty table at its fillfactor, as the live table
    # reports it, and 45 leaves room: the loaded pages hold fewer rows. (After the
    # drain either may be larger at 40 rows: updates that find no room at 100 move
    # to new pages.)
    assert all(d["table_fillfactor"] == d["fillfactor"] for d in drains)
    loaded = {ff: min(d["loaded_heap_bytes_per_row"] for d in drains
                      if d["fillfactor"] == ff)
              for ff in (45, 100)}  # fmt: skip
    assert loaded[45] > loaded[100] > 0
