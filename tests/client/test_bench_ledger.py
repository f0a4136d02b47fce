"""Smoke test of ``bench/peers.py --ledger`` at a tiny size: on its own database it
runs the transition and the reservation at each step of the guarantee-cost ledger
(the lean baseline, then row-level security, the guard trigger, the hash chain, the
outbox row and the month partitions added one at a time), then the services'
statements by raw psycopg and the services themselves, checks each step's rows, and
writes CPU per operation for every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import peers
from bench.spec import LEDGER_FLAVOURS
from tests.client.bench_databases import bench_databases

# Migrating its own database is most of its time (about a minute on a loaded machine).
pytestmark = pytest.mark.slow
DURATION = os.environ.get("PORTAL_LEDGER_DURATION", "0.3")


def test_the_ledger_measures_each_guarantee_and_the_services(tmp_path: Path) -> None:
    out = tmp_path / "ledger.json"
    # A process of its own, as it is run: it sets Django up on its own database.
    with bench_databases("ledger") as (url,):
        # fmt: off
        done = subprocess.run([
            sys.executable, "bench/peers.py", "--ledger", "--clients", "1",
            "--duration", DURATION, "--rounds", "1", "--warmup", "2", "--no-docs",
            "--json", str(out), "--database-url", url,
        ], cwd=peers.REPO, capture_output=True, text=True, timeout=600)
        # fmt: on

    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    got = {(run["workload"], run["flavour"]): run for run in runs}
    # Every step of both workloads ran, and main checked each step's rows (events,
    # and outbox rows from the outbox step on) against the operations it counted.
    expected = {
        (workload, flavour)
        for workload in ("transition", "reservation")
        for flavour in peers.LEDGER_ROWS
    }
    assert set(peers.LEDGER_ROWS) == {*LEDGER_FLAVOURS, "raw", "service"}
    assert set(got) == expected
    for run in got.values():
        assert run["ops_per_s"] > 0
        assert run["cpu_us_per_op"] > 0
    table = peers.ledger_table(
        [peers.report.RunSummary(**run) for run in runs], [1]
    ).splitlines()
    assert len(table) == 2 + len(expected)
    assert "row-level security" in table[3]
