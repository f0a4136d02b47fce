"""Smoke test of ``bench/profile_request.py`` at a tiny size: on its own seeded
database it sends reservations through the whole WSGI stack in this process, every
one answered 201, writes CPU and wall time per request for each round, prints a
cProfile of one more round, and leaves no scratch folder behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.bench_databases import bench_databases

# Migrating and seeding its own database is most of its time.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_url() -> Iterator[str]:
    # The bench drops only a database whose name says "bench".
    with bench_databases("profile_request") as (url,):
        yield url


def test_the_request_profiler_times_and_profiles_every_round(
    bench_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "profile-request.json"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, "bench/profile_request.py", "--workload", "reservation",
         "--requests", "5", "--rounds", "2", "--profile", "--top", "10",
         "--json", str(out), "--database-url", bench_url],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    figures = json.loads(out.read_text())
    assert (figures["workload"], figures["requests"]) == ("reservation", 5)
    assert len(figures["cpu_us"]) == len(figures["wall_us"]) == 2
    assert all(cpu > 0 for cpu in figures["cpu_us"])
    assert all(wall > 0 for wall in figures["wall_us"])
    # Every request (the untimed warm-up's too) reserved a new operation.
    assert list(figures["statuses"]) == ["201 Created"]
    assert figures["statuses"]["201 Created"] >= 5 * 2
    assert "process CPU per request best" in done.stdout
    # The cProfile, by both orders, covers the WSGI application gunicorn calls.
    assert "Ordered by: internal time" in done.stdout
    assert "Ordered by: cumulative time" in done.stdout
    assert "django/core/handlers/wsgi.py" in done.stdout
    # The file broker its relay nudges went to is gone with the process.
    assert list(scratch.iterdir()) == []
