"""Smoke test of ``bench/chain_head.py`` at a tiny size: it makes its two databases
(audit migrated back to 0013, before the head row, and to 0016, after it), times a
few head lookups and chained appends on each, prints every round and the medians,
and leaves each database's one chain of 50 events as it made it (the timed appends
are rolled back)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.client.bench_databases import bench_databases

# Migrating two databases, then back, is most of its time.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
VARIANTS = {"before": "0013", "after": "0016"}
NUMBER = r"(\d+(?:\.\d+)?)"


@pytest.fixture
def bench_url() -> Iterator[str]:
    # The bench drops only databases whose names say "bench"; it makes two from the
    # URL's name, one per variant.
    variants = [f"chain_head_{variant}" for variant in VARIANTS]
    with bench_databases("chain_head", *variants) as (url, *_):
        yield url


def test_the_chain_head_bench_times_both_schemas_and_keeps_their_rows(
    bench_url: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "bench/chain_head.py", "--partitions", "3", "--lookups", "5",
         "--appends", "5", "--rounds", "1", "--database-url", bench_url],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    for variant in VARIANTS:
        line = re.search(
            rf"^round 1 +{variant}: head lookup +{NUMBER} µs,"
            rf" chained insert +{NUMBER} µs$",
            done.stdout,
            re.M,
        )
        assert line, done.stdout
        assert float(line[1]) > 0 and float(line[2]) > 0
    for kind in ("lookup", "append"):
        line = re.search(
            rf"^{kind}: median before {NUMBER} µs, after {NUMBER} µs,"
            rf" after/before {NUMBER}$",
            done.stdout,
            re.M,
        )
        assert line, done.stdout
        assert all(float(figure) > 0 for figure in line.groups())

    for variant, migration in VARIANTS.items():
        with psycopg.connect(f"{bench_url}_{variant}") as conn:
            applied = conn.execute(
                "SELECT max(name) FROM django_migrations WHERE app = 'audit'"
            ).fetchone()
            head_table = conn.execute(
                "SELECT to_regclass('audit_chainhead')"
            ).fetchone()
            # The administrator reads past row-level security.
            events = conn.execute("SELECT count(*) FROM audit_event").fetchone()
        assert applied and applied[0].startswith(f"{migration}_"), (variant, applied)
        # The head row came with audit 0014: only the "after" schema has it.
        assert head_table and (head_table[0] is not None) == (variant == "after")
        assert events == (50,), variant
