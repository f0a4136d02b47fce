"""bench/peers.py's side rows: the REST rows (keep-alive and ``Connection: close``)
and the agent's doors (the one call against six, MCP over REST, CPU per action)
are rendered from their benchmarks' JSON with the issue's aims."""

from __future__ import annotations

from typing import Any

from bench import peers


def _rest() -> dict[str, Any]:
    def run(flavour: str, clients: int, ops: float, p99: float) -> dict[str, Any]:
        return {
            "flavour": flavour,
            "clients": clients,
            "ops_per_s": ops,
            "p50_ms": p99 / 2,
            "p99_ms": p99,
        }

    return {
        "meta": {"workers": "ProblemThreadWorker, 2 processes x 4 threads"},
        "runs": [
            run("raw", 16, 1000.0, 30.0),
            run("api", 16, 450.0, 40.0),
            run("close", 16, 300.0, 80.0),
        ],
    }


def _doors() -> dict[str, Any]:
    return {
        "meta": {"actions": 40, "mcp_actions": 20},
        "flows": {"one_call_per_s": 20.0, "six_calls_per_s": 8.0, "ratio": 2.5},
        "cpu_ms_per_action": {
            "rest": {"web_ms": 50.0, "mcp_ms": 0.0},
            "mcp": {"web_ms": 10.0, "mcp_ms": 43.0},
        },
        "latency": [
            {
                "clients": 1,
                "rest_p50_ms": 100.0,
                "rest_p99_ms": 150.0,
                "mcp_p50_ms": 103.5,
                "mcp_p99_ms": 160.0,
                "samples": 20,
            },
            {
                "clients": 8,
                "rest_p50_ms": 300.0,
                "rest_p99_ms": 500.0,
                "mcp_p50_ms": 320.0,
                "mcp_p99_ms": 560.0,
                "samples": 160,
            },
        ],
    }


def test_the_rest_rows_show_keep_alive_and_close_against_raw() -> None:
    lines = peers.side_table({"rest": _rest()}).splitlines()
    keep = next(line for line in lines if "keep-alive" in line)
    close = next(line for line in lines if "`Connection: close`" in line)
    assert "**45% of raw**" in keep
    assert ">= 40%, p99 < 50 ms" in keep
    assert "2 processes x 4 threads" in keep
    assert "30% of raw" in close


def test_the_doors_rows_show_the_ratio_the_mcp_gap_and_cpu() -> None:
    lines = peers.side_table({"doors": _doors()}).splitlines()
    one = next(line for line in lines if "one-call action" in line)
    assert "**2.50x**" in one and ">= 2x" in one
    gaps = [line for line in lines if "MCP tool call vs the REST one call" in line]
    assert [g.split("|")[2].strip() for g in gaps] == ["1", "8"]
    assert "**+3.5 ms**" in gaps[0] and "**+20.0 ms**" in gaps[1]
    assert all("< 5 ms" in g for g in gaps)
    cpu = next(line for line in lines if "server CPU per action" in line)
    assert "| 53.0 | 50.0 | +3.0 ms |" in cpu


def test_doors_is_a_side_benchmark_peers_runs_by_default() -> None:
    args = peers.parse_args([])
    assert "doors" in args.also.split(",")
