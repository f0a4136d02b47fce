"""Smoke test of ``bench/api.py`` (its work is ``bench/api_coordinator.py``) at a
tiny size: on its own seeded database it starts gunicorn with one worker process,
checks the statements each request runs, and measures both workloads through the
HTTP API (keep-alive and ``Connection: close``) and raw psycopg, with one client.
Every run has operations and no failed request, the outcome check in the database
passed, and the server's CPU per request is there, its web part included."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.bench_databases import bench_databases

# Migrating and seeding its own database and starting gunicorn is most of its time.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ("reservation", "transition")
FLAVOURS = ("raw", "api", "close")


@pytest.fixture
def bench_url() -> Iterator[str]:
    # The bench drops only a database whose name says "bench".
    with bench_databases("api") as (url,):
        yield url


def test_the_api_bench_runs_every_workload_and_flavour(
    bench_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "api.json"
    done = subprocess.run(
        [sys.executable, "bench/api.py", "--clients", "1", "--duration", "0.4",
         "--rounds", "1", "--warmup", "1", "--workers", "1", "--no-docs",
         "--json", str(out), "--database-url", bench_url],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = json.loads(out.read_text())
    meta, runs = report["meta"], report["runs"]
    assert meta["failed_checks"] == []
    assert meta["clients"] == [1]
    assert ", 1 processes x " in meta["workers"]  # counted on the live server
    # The requests' statements were captured, the service's own among them.
    assert "reserve" in meta["api_statements"]["reservation"]
    assert "transition" in meta["api_statements"]["transition"]
    got = {(run["workload"], run["flavour"]): run for run in runs}
    assert set(got) == {(w, f) for w in WORKLOADS for f in FLAVOURS}
    for key, run in got.items():
        assert run["clients"] == 1, key
        assert run["ops"] > 0 and run["ops_per_s"] > 0, key
        assert run["errors"] == 0 and run["failures"] == {}, key
        assert 0 < run["p50_ms"] <= run["p99_ms"], key
        assert run["cpu_us_per_op"] > 0 and run["server_cpu_us_per_op"] > 0, key
        # The gunicorn workers' CPU is read apart from the database's: raw psycopg
        # never reaches them, each HTTP request does.
        if key[1] == "raw":
            assert run["web_cpu_us_per_op"] == 0, key
        else:
            assert run["web_cpu_us_per_op"] > 0, key
    assert "**Reserve operation:" in done.stdout
    assert "**Transition:" in done.stdout
