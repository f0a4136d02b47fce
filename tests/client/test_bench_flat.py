"""Smoke test of ``bench/flat.py`` at a tiny size: it loads its scale database with
100 tasks and 1,000 events (``manage.py load_scale_data``; the default is 1M and
10M), then runs one pair of ``bench/run.py`` (transition, one client, one short
round), on a fresh empty database and on the scale one, and compares them: a row
per flavour with positive rates on both sides. Both databases are its own and
dropped afterwards; ``--no-docs``: docs/performance.md is not touched."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.client.bench_databases import bench_databases

# Migrating three times (the scale database, the empty one, the scale one again for
# its run) is most of its time.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SIDES = ("empty", "scale")


@pytest.fixture
def bench_urls() -> Iterator[dict[str, str]]:
    # The bench drops only databases whose names say "bench".
    with bench_databases(*(f"flat_{side}" for side in SIDES)) as urls:
        yield dict(zip(SIDES, urls, strict=True))


def test_the_flat_bench_compares_a_loaded_database_with_an_empty_one(
    bench_urls: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "flat.json"
    done = subprocess.run(
        [sys.executable, "bench/flat.py", "--tasks", "100", "--events", "1000",
         "--pairs", "1", "--workloads", "transition", "--clients", "1",
         "--duration", "0.3", "--rounds", "1", "--empty-url", bench_urls["empty"],
         "--scale-url", bench_urls["scale"], "--no-docs", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = json.loads(out.read_text())
    meta, rows = report["meta"], report["rows"]
    # The loaded database holds what was asked, before the runs added their own.
    assert (meta["scale_tasks"], meta["scale_events"]) == (100, 1000)
    assert meta["pairs"] == 1
    assert {row["flavour"] for row in rows} >= {"service", "raw"}
    for row in rows:
        assert (row["workload"], row["clients"]) == ("transition", 1), row
        assert row["empty_ops_per_s"] > 0 and row["scale_ops_per_s"] > 0, row
        assert row["ratio"] == pytest.approx(
            row["scale_ops_per_s"] / row["empty_ops_per_s"]
        )
        assert len(row["empty_rounds"]) == len(row["scale_rounds"]) == 1, row
        assert row["empty_cpu_us"] > 0 and row["scale_cpu_us"] > 0, row
    # The scale side ran on the loaded rows (--reuse), beside them.
    with psycopg.connect(bench_urls["scale"]) as conn:
        tenants = conn.execute(
            "SELECT count(*) FILTER (WHERE slug LIKE 'scale-t%'), count(*)"
            " FROM portal_tenant"
        ).fetchone()
    assert tenants is not None and tenants[0] == 20 and tenants[1] > 20, tenants
    assert "| workload | flavour | clients | empty ops/s |" in done.stdout
