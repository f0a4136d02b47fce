"""Smoke tests of ``bench/run.py`` (the services against raw psycopg) and
``bench/profile_client.py`` (where one client's time goes) at a tiny size, each on
its own database, seeded as their runs are (``recreate_database(seed=True)``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bench import peers
from tests.client.bench_databases import bench_databases

# Migrating and seeding its own database is most of each one's time.
pytestmark = pytest.mark.slow


@pytest.fixture
def bench_url(request: pytest.FixtureRequest) -> Iterator[str]:
    # The benchmarks drop only a database whose name says "bench".
    name = request.node.name.removeprefix("test_the_")[:30]
    with bench_databases(name) as (url,):
        yield url


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=peers.REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_service_layer_bench_runs_and_checks_its_rows(
    bench_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "run.json"
    done = _bench(
        "bench/run.py", "--workloads", "transition", "--clients", "1",
        "--duration", "0.4", "--rounds", "1", "--warmup", "2", "--no-docs",
        "--json", str(out), "--database-url", bench_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert {run["flavour"] for run in runs} >= {"service", "raw"}
    assert all(run["ops_per_s"] > 0 for run in runs)
    # The seed went in before the runs (other tenants' events, analysed).
    with psycopg.connect(bench_url) as conn:
        (events,) = conn.execute("SELECT count(*) FROM audit_event").fetchone() or (0,)
    assert events >= 20_000


def test_the_client_profiler_runs_every_flavour(bench_url: str) -> None:
    done = _bench(
        "bench/profile_client.py", "--workload", "reservation", "--ops", "30",
        "--rounds", "1", "--top", "5", "--database-url", bench_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for flavour in ("raw", "django-sql", "service"):
        assert f"  {flavour} " in done.stdout, flavour
    assert "model_from_row(Operation, row)" in done.stdout  # its timed parts
    assert "cProfile of service" in done.stdout
