"""Smoke test of ``bench/admin_pages.py`` on a tiny ``load_scale_data`` database of
its own (200 tasks, 2,000 events, two tenants), one round: it logs in over HTTP as
the largest tenant's reviewer against gunicorn, and every page it finds either
answered 200 and was timed with its raw SQL floor, or was refused (403) and left
out; the task page, both trace searches, the takeover desk and the export's start
were among the timed ones. ``--no-docs``: docs/performance.md is not touched."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.bench_databases import small_scale_database

# Migrating and loading its own database and starting gunicorn is most of its time.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ROUNDS = 1


@pytest.fixture
def loaded_url() -> Iterator[str]:
    """An administrator's URL of a migrated database with a small load in it."""
    with small_scale_database("admin_pages") as url:
        yield url


def test_the_admin_pages_bench_times_every_page_the_reviewer_may_open(
    loaded_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "admin-pages.json"
    done = subprocess.run(
        [sys.executable, "bench/admin_pages.py", "--database-url", loaded_url,
         "--rounds", str(ROUNDS), "--no-docs", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    result = json.loads(out.read_text())
    meta, pages = result["meta"], result["pages"]
    assert meta["tenant"].startswith("scale-t")
    assert meta["username"] == f"reviewer-{meta['tenant'].removeprefix('scale-')}"
    assert meta["counts"]["tasks_task"] == 200
    assert meta["rounds"] == ROUNDS
    timed = {page["name"]: page for page in pages if page["path"]}
    for name, page in timed.items():
        if page["status"] == 200:
            assert len(page["http_ms"]) == ROUNDS, name
            assert all(ms > 0 for ms in page["http_ms"]), name
            assert len(page["sql_ms"]) == (ROUNDS if name != "admin index" else 0)
        else:
            assert page["status"] == 403, (name, page["status"])
            assert page["http_ms"] == [], name
    answered = {name for name, page in timed.items() if page["status"] == 200}
    assert {
        "admin index",
        "audit.Event list",
        "tasks.Task list",
        "task page (most events)",
        "event search by trace id",
        "task search by trace id",
    } <= answered
    assert any(name.startswith("takeover desk (") for name in answered)
    exports = [timed[name] for name in answered if timed[name]["first_row"]]
    assert exports, "no export was timed to its first row"
    # The Markdown section it would have written, on stdout.
    assert "## Admin pages at scale, as a reviewer of one tenant" in done.stdout
    assert "| admin index | `/admin/` | 200 |" in done.stdout
