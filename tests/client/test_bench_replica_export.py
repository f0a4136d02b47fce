"""Smoke test of bench/replica_export.py at a tiny size: its own primary and hot
standby, 2,000 events, 8 agents for a few seconds; every export holds every event of
the tenant and was read on the standby, and the figures are there both ways. With
two CPUs or more it runs ``--pin``: the primary's side on one CPU, the standby's on
the other, read back off the live processes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import replica_export

REPO = Path(__file__).resolve().parents[2]
EVENTS = 2000


@pytest.mark.slow
# Two nodes, a migration, a load and gunicorn: a minute or two on a quiet machine,
# several on a loaded 2-core one.
@pytest.mark.timeout(900)
def test_the_bench_exports_every_event_from_the_standby_while_agents_reserve(
    tmp_path: Path,
) -> None:
    out = tmp_path / "replica-export.json"
    cpus = sorted(os.sched_getaffinity(0))
    pinned = len(cpus) >= 2
    subprocess.run(
        [sys.executable, "bench/replica_export.py", "--events", str(EVENTS),
         "--duration", "3", "--slice", "1", "--rounds", "2", "--no-docs",
         "--json", str(out), *["--pin"] * pinned],
        cwd=REPO, check=True, timeout=900,
    )  # fmt: skip
    result = json.loads(out.read_text())

    assert result["failed_checks"] == []
    for phase in ("without", "with"):
        for flavour in ("api", "raw"):
            figures = result["phases"][phase][flavour]
            assert figures["ops"] > 0 and figures["errors"] == 0, (phase, figures)
            assert 0 < figures["p50_ms"] <= figures["p99_ms"]
    # The export phase ran at least as many slices (more when waiting for an export).
    slices = {p: result["phases"][p]["api"]["slices"] for p in ("without", "with")}
    assert slices["with"] >= slices["without"] >= 4  # 2 rounds of 2 pairs
    # The load's events, and the tenant's set-up's few.
    expected = result["expected_rows"]
    assert EVENTS - 10 <= expected <= EVENTS + 50
    exports = result["exports"]
    assert len(exports) >= 2  # one per round at least
    for number, export in enumerate(exports):
        assert export["status"] == 200
        # Every event, plus the earlier exports' records once replayed.
        assert expected <= export["rows"] <= expected + number
    # Read on the standby: it is one, and it read every exported row; the primary
    # read only what the agents' own appends need.
    assert result["standby_in_recovery"] is True
    read = result["event_rows_read"]
    total = sum(export["rows"] for export in exports)
    assert read["standby"] >= total
    assert read["primary"] < total
    meta = result["meta"]
    assert (meta["events"], meta["clients"], meta["rounds"]) == (EVENTS, 8, 2)
    # Each phase's resources: the primary's process tree worked and committed in
    # both; the standby returned the exported rows only in the "with" phase.
    usage = result["usage"]
    for phase in ("without", "with"):
        assert usage[phase]["cpu_s"]["primary"] > 0, usage[phase]
        assert usage[phase]["primary"]["xact_commit"] > 0, usage[phase]
        assert usage[phase]["primary"]["wal_bytes"] > 0, usage[phase]
    assert usage["with"]["standby"]["tup_returned"] >= total
    assert usage["without"]["standby"]["tup_returned"] < total
    assert meta["pin"] is pinned
    if pinned:
        # Every thread of each group on its CPU, at the start and at the end
        # (backends forked during the run inherit the postmaster's mask).
        first, second = (str(cpu) for cpu in cpus[:2])
        expected = {
            "primary": first, "agents' web": first, "agents": first,
            "standby": second, "reviewer's web": second, "this process": second,
        }  # fmt: skip
        assert result["pinned"] == expected
        for moment in ("start", "end"):
            seen = result["cpus_allowed"][moment]
            assert {name: set(values) for name, values in seen.items()} == {
                name: {cpu} for name, cpu in expected.items()
            }, (moment, seen)
        # The reviewer's web did the export: it worked only with one.
        assert usage["with"]["cpu_s"]["reviewer's web"] > 0
    section = replica_export.markdown_section(result)
    assert "| Primary: CPU ms per agent operation |" in section


def _passing() -> dict[str, Any]:
    figures = {"ops": 10, "errors": 0, "p50_ms": 1.0, "p99_ms": 2.0}
    return {
        "phases": {p: {"api": figures, "raw": figures} for p in ("without", "with")},
        "exports": [{"rows": 100, "seconds": 1.0, "status": 200}],
        "expected_rows": 100,
        "standby_in_recovery": True,
        "event_rows_read": {"standby": 100, "primary": 5},
        "pinned": {"primary": "0", "standby": "1"},
        "cpus_allowed": {
            moment: {"primary": {"0": 20}, "standby": {"1": 5}}
            for moment in ("start", "end")
        },
    }


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("event_rows_read", "primary"), 150, "the primary read"),
        (("event_rows_read", "standby"), 99, "the standby read"),
        (("standby_in_recovery",), False, "not in recovery"),
        (("exports",), [], "no export finished"),
        (("exports", 0, "rows"), 99, "export 1"),
        (("phases", "with", "api", "errors"), 1, "with api"),
        (("cpus_allowed", "end", "primary"), {"0": 20, "0-1": 1}, "primary at the end"),
        (("cpus_allowed", "start", "standby"), {"0": 5}, "standby at the start"),
    ],
)
def test_the_checks_refuse_a_run_that_did_not_measure_what_it_says(
    path: tuple[Any, ...], value: Any, says: str
) -> None:
    """An export read on the primary, a short export, a standby that is not one, a
    failed request or a pinned process found on another CPU makes the run fail
    instead of reporting figures."""
    assert replica_export.checks(_passing()) == []
    result = copy.deepcopy(_passing())
    target: Any = result
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    failed = replica_export.checks(result)
    assert any(says in problem for problem in failed), failed
