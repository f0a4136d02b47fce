"""Smoke test of ``bench/story_pages.py`` on its own database loaded by its own
``bench/story_load.sql``, shrunk: the loader has one size written into it, 100,000
tasks (1M events) over ten tenants, and the test runs it with 6,000 tasks instead
(600 a tenant, 60,000 events); the bench opens ``bench-1``'s 501st task, so 5,010
would be the fewest. Every page answers 200 five times (the bench asserts it), a
line per page gives its median, its queries and the slowest, ``--plans`` adds that
query's plan, and the export's first rows are timed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bench.service_layer import recreate_database
from tests.client.bench_databases import bench_databases

# Migrating and loading its own database is most of its time.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
FULL_SIZE = "generate_series(1, 100000)"
PAGES = (
    "event list", "event search trace", "event search object id",
    "event search task id", "event filter task", "event filter code",
    "event range 1 day", "event filter actor", "task list", "task search trace",
    "task search object", "task page",
)  # fmt: skip


@pytest.fixture
def loaded_url() -> Iterator[str]:
    """An administrator's URL of a migrated database holding the story's load."""
    load = (REPO / "bench" / "story_load.sql").read_text()
    assert load.count(FULL_SIZE) == 1, "story_load.sql's size has moved"
    with bench_databases("story_pages") as (url,):
        recreate_database(url)
        # As the administrator, as `psql -f` runs it (the load is plain SQL).
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(load.replace(FULL_SIZE, "generate_series(1, 6000)"))
        yield url


def test_the_story_pages_bench_times_every_reviewer_page(loaded_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.story_pages", "--plans"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "DATABASE_URL": loaded_url, "PORTAL_NO_BOOTSTRAP": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    for page in PAGES:
        line = re.search(
            rf"^{re.escape(page)} +median +([\d.]+) ms, +(\d+) queries,"
            rf" slowest ([\d.]+) ms\n((?:    .*\n)+)",
            done.stdout,
            re.M,
        )
        assert line, (page, done.stdout)
        assert float(line[1]) > 0 and int(line[2]) > 0, line[0]
        assert line[4].strip(), line[0]  # the slowest query's plan (--plans)
    export = re.search(r"^export first rows +([\d.]+) ms$", done.stdout, re.M)
    assert export and float(export[1]) > 0, done.stdout
    # The reviewer it made on its first run, in the story's first tenant.
    with psycopg.connect(loaded_url) as conn:
        member = conn.execute(
            "SELECT m.role FROM portal_membership m"
            " JOIN auth_user u ON u.id = m.user_id"
            " JOIN portal_tenant t ON t.id = m.tenant_id"
            " WHERE u.username = 'bench-reviewer' AND t.slug = 'bench-1'"
        ).fetchall()
    assert member == [("reviewer",)]
