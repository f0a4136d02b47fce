"""Smoke test of ``bench/value_checks.py`` at a tiny size: on its own database it
makes every group's variants (no check, a table CHECK, a domain or a cheaper
form), proves each wall refuses its bad row and the floor does not, and times
every variant."""

from __future__ import annotations

from bench import value_checks
from tests.client.bench_databases import bench_databases


def test_the_value_check_bench_runs_every_variant_and_each_wall_holds() -> None:
    with bench_databases("value_checks") as (url,):
        result = value_checks.run(url, inserts=50, rounds=1)

    got = {(v["list"], v["kind"]): v for v in result["variants"]}
    lists = ("event code", "reason code", "task state", "operation state",
             "outbox state", "actor type", "payload size", "non-negative integer")  # fmt: skip
    id_time = ("none", "table CHECK, SQL function", "table CHECK, PL/pgSQL function")
    assert set(got) == {
        (name, kind) for name in lists for kind in ("none", "table CHECK", "domain")
    } | {("id time", kind) for kind in id_time}
    for (_, kind), variant in got.items():
        assert variant["refuses"] is (kind != "none"), variant
        assert variant["us_per_insert"] > 0
    # The lists are the migrations' frozen copies, as long as the enums were then.
    assert got["event code", "domain"]["size"] >= 61
    assert got["reason code", "domain"]["size"] >= 20
    assert got["task state", "domain"]["size"] == 8
    # Every timed insert (and the floor's accepted bad row) is in the tables.
    assert result["rows_seen"] == len(got) * 50 + len(lists) + 1
    assert "| event code | 61 |" in value_checks.table(result)
