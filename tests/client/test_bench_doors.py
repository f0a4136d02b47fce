"""Smoke test of bench/doors.py at a tiny size: it starts ``manage.py up
--no-worker`` on its own database, takes actions through both flows and both doors
against the real desk, and writes figures that are rates, latencies and CPU."""

from __future__ import annotations

import json
from pathlib import Path

from bench import doors
from tests.client.bench_databases import bench_databases


def test_the_doors_bench_runs_on_its_own_up_and_writes_its_figures(
    tmp_path: Path,
) -> None:
    out = tmp_path / "doors.json"
    with bench_databases("doors") as (url,):
        # fmt: off
        code = doors.main([
            "--database-url", url, "--actions", "1", "--mcp-actions", "1",
            "--clients", "1,2", "--slice", "1", "--json", str(out),
        ])
        # fmt: on

    assert code == 0
    figures = json.loads(out.read_text())
    assert figures["flows"]["one_call_per_s"] > 0
    assert figures["flows"]["six_calls_per_s"] > 0
    assert [row["clients"] for row in figures["latency"]] == [1, 2]
    # One action per client and door at each count: the samples are the actions.
    assert [row["samples"] for row in figures["latency"]] == [1, 2]
    for door in ("rest", "mcp"):
        cpu = figures["cpu_ms_per_action"][door]
        assert cpu["web_ms"] + cpu["mcp_ms"] > 0
    # The MCP door's action ran in the MCP processes, the REST door's in gunicorn.
    assert figures["cpu_ms_per_action"]["mcp"]["mcp_ms"] > 0
