"""Smoke test of ``bench/index_users.py`` on a tiny ``load_scale_data`` database of
its own (200 tasks, 2,000 events, two tenants): it prints a row per index and user
with the plan as the app role sees it; every index it names exists, the lookups by
id name their index, and the writes it only explains leave the outbox as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.client.bench_databases import small_scale_database

# Migrating and loading its own database is most of its time.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def loaded_url() -> Iterator[str]:
    """An administrator's URL of a migrated database with a small load in it."""
    with small_scale_database("index_users") as url:
        yield url


def _outbox(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT state::text, count(*) FROM audit_outbox GROUP BY 1 ORDER BY 1"
        ).fetchall()


def test_the_index_bench_shows_each_index_beside_its_query(
    loaded_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "index-users.json"
    outbox_before = _outbox(loaded_url)
    done = subprocess.run(
        [sys.executable, "bench/index_users.py", "--database-url", loaded_url,
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    rows = json.loads(out.read_text())
    indexes = {row["index"] for row in rows}
    assert {"audit_outbox_pkey", "audit_outbox_due_idx", "audit_event_pkey"} <= indexes
    assert {index.split("_")[1] for index in indexes} == {"outbox", "event"}
    with psycopg.connect(loaded_url) as conn:
        for index in sorted(indexes):
            found = conn.execute("SELECT to_regclass(%s)", [index]).fetchone()
            assert found and found[0] is not None, f"{index} is not in the schema"
    for row in rows:
        assert row["full"].strip(), row  # a plan for every use
        if row["plan"] != "NOT IN PLAN":
            assert "using" in row["plan"] or " on " in row["plan"], row
    # One row by id, on a table of a thousand rows and more, is an index scan.
    by_id = {
        row["index"]: row["plan"]
        for row in rows
        if row["user"].startswith(("the outbox row's admin page", "an event by id"))
    }
    assert set(by_id) == {"audit_outbox_pkey", "audit_event_pkey"}
    assert "NOT IN PLAN" not in by_id.values(), by_id
    # The table it prints: a header, a rule and a line per row.
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| index | read by | plan line | buffers, time |"
    assert len(table) == 1 + len(rows)
    # The relay's claim, its marking and the purge were explained, not run.
    assert _outbox(loaded_url) == outbox_before
    assert sum(count for _, count in outbox_before) > 0
