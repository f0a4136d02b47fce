"""Smoke test of ``bench/partition_plans.py`` at a small size: on its own database,
laid out in sixteen month partitions of 1,000 events (the default is 20,000), it
prints the event browser's three plans, and each reads the partitions its title
says. At 10 events a month the planner reads each partition whole rather than by
its index, so the plans would no longer be the ones the bench is there to show."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.bench_databases import bench_databases

# Migrating its own database is most of its time.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_url() -> Iterator[str]:
    # The bench drops only a database whose name says "bench".
    with bench_databases("plans") as (url,):
        yield url


def _partition(year: int, month: int) -> str:
    return f"audit_event_p{year:04d}{month:02d}"


def test_the_plans_bench_prints_each_query_on_the_partitions_it_names(
    bench_url: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "bench/partition_plans.py", "--events-per-month", "1000",
         "--database-url", bench_url],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    sections = re.findall(
        r"^#### ([^\n]+)\n\n```\n(.*?)\n```", done.stdout, re.M | re.S
    )
    assert len(sections) == 3, done.stdout
    (one_title, one), (two_title, two), (_, every) = sections
    # The titles name the month the filters fall in; the plans read only its
    # partition, then it and the month before.
    found = re.match(r"Created from (\d{4})-(\d{2})-08 until", one_title)
    assert found, one_title
    year, month = int(found[1]), int(found[2])
    before = (year, month - 1) if month > 1 else (year - 1, 12)
    assert f"across the start of {year:04d}-{month:02d}" in two_title
    assert set(re.findall(r"audit_event_p\d{6}", one)) == {_partition(year, month)}
    assert set(re.findall(r"audit_event_p\d{6}", two)) == {
        _partition(*before),
        _partition(year, month),
    }
    # No range: all sixteen months (twelve back to three ahead), each read by a
    # backward scan of its own tenant/created index, merged newest first.
    scans = re.findall(
        r"Index Scan Backward using (audit_event_p\d{6})_tenant_id_created_at_id_idx",
        every,
    )
    assert len(scans) == len(set(scans)) == 16, every
    assert "Merge Append" in every
