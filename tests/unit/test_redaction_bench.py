"""bench/redaction.py runs, compares against its baseline and writes its rows."""

from __future__ import annotations

import json

from bench import redaction as bench


def test_the_bench_runs_every_shape_and_writes_its_rows(tmp_path, capsys):
    out = tmp_path / "redaction.json"
    assert (
        bench.main(["--sizes", "2000,70000", "--repeat", "1", "--json", str(out)]) == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [row["shape"] for row in rows] == [
        "one_string",
        "many_strings",
        "nested",
    ] * 2
    assert all(row["input_bytes"] >= 2000 for row in rows[:3])
    assert all(row["input_bytes"] >= 70000 for row in rows[3:])
    assert all(row["redact_ms"] > 0 and row["baseline_ms"] > 0 for row in rows)
    # a string over the cap is kept as a reference, never as its text
    assert rows[3]["stored_bytes"] < 200
    assert "one_string" in capsys.readouterr().out
