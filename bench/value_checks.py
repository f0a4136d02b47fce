"""What a closed list of values costs a write: a table CHECK against a domain.

    .venv/bin/python bench/value_checks.py [--database-url postgres://.../portal_bench_checks]
        [--inserts 20000] [--rounds 5] [--json PATH]

Makes an empty database (its name must contain "bench": it is dropped and made
again) with one small table per variant, then, in interleaved rounds, makes
``--inserts`` single-row INSERTs into each in a server-side PL/pgSQL loop (each
INSERT its own statement, as PostgreSQL counts them for CHECKs; no client round
trip or commit in the figure, so a loaded machine moves it little). The variants:

- ``none``: a ``varchar`` column, no check (the floor);
- ``table CHECK``: the list as Django writes ``Q(code__in=...)``, a CHECK on the
  table, which PostgreSQL parses again from its stored text at every statement;
- ``domain``: the column's type is a domain with the same list, whose CHECK is
  parsed once per session (``portal/domains.py``, what the portal uses since
  issue 23).

for the 62 event codes and the 20 reason codes, as frozen by the migrations that
made the domains. Prints the median µs per insert of each variant and what the
check adds over ``none``; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal_bench_checks"


def value_lists() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """name -> (base type, values, a valid value), as the migrations froze them."""
    events = importlib.import_module(
        "audit.migrations.0027_reason_and_event_code_domains"
    )
    reasons = importlib.import_module("portal.migrations.0014_reason_code_domain")
    return {
        "event code": ("varchar(60)", events.EVENT_CODES, "task.transitioned"),
        "reason code": ("varchar(40)", reasons.REASON_CODES, "STALE_STATE"),
    }


def _in_list(column: str, values: tuple[str, ...]) -> str:
    """The CHECK as Django's ``Q(column__in=values)`` makes it on a CharField."""
    items = ", ".join(f"'{v}'::varchar" for v in values)
    return f"(({column})::text = ANY ((ARRAY[{items}])::text[]))"


def variants() -> list[dict[str, Any]]:
    made = []
    for n, (label, (base, values, valid)) in enumerate(value_lists().items()):
        quoted = ", ".join(f"'{v}'" for v in values)
        for kind in ("none", "table CHECK", "domain"):
            table = f"t{n}_{kind.split()[0].lower()}"
            if kind == "domain":
                setup = [
                    f"CREATE DOMAIN d{n} AS {base} CHECK (VALUE IN ({quoted}))",
                    f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v d{n} NOT NULL)",
                ]
            elif kind == "table CHECK":
                setup = [
                    f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v {base} NOT NULL"
                    f" CHECK {_in_list('v', values)})"
                ]
            else:
                columns = f"id bigserial PRIMARY KEY, v {base} NOT NULL"
                setup = [f"CREATE TABLE {table} ({columns})"]
            made.append(
                {"list": label, "size": len(values), "kind": kind, "table": table,
                 "setup": setup, "valid": valid}
            )  # fmt: skip
    return made


def recreate(database_url: str) -> None:
    name = str(psycopg.conninfo.conninfo_to_dict(database_url).get("dbname", ""))
    if "bench" not in name:
        raise SystemExit(f"refusing to drop {name!r}: its name must contain 'bench'")
    admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def insert_us(conn: psycopg.Connection[Any], table: str, value: str, n: int) -> float:
    """µs per single-row INSERT statement, made ``n`` times in a PL/pgSQL loop."""
    loop = (
        f"DO $$ BEGIN FOR i IN 1..{int(n)} LOOP "
        f"INSERT INTO {table} (v) VALUES ('{value}'); END LOOP; END $$"
    )
    started = time.perf_counter()
    conn.execute(loop)
    return (time.perf_counter() - started) / n * 1e6


def run(database_url: str, *, inserts: int, rounds: int) -> dict[str, Any]:
    recreate(database_url)
    made = variants()
    with psycopg.connect(database_url, autocommit=True) as conn:
        for variant in made:
            for statement in variant["setup"]:
                conn.execute(statement)
        # The walls hold: a made-up value is refused by the table CHECK and the domain.
        for variant in made:
            try:
                conn.execute(f"INSERT INTO {variant['table']} (v) VALUES ('made.up')")
            except psycopg.errors.CheckViolation:
                variant["refuses"] = True
            else:
                variant["refuses"] = False
        samples: dict[str, list[float]] = {v["table"]: [] for v in made}
        for _ in range(rounds):
            for variant in made:
                samples[variant["table"]].append(
                    insert_us(conn, variant["table"], variant["valid"], inserts)
                )
        rows = sum(
            conn.execute(f"SELECT count(*) FROM {v['table']}").fetchone()[0]  # type: ignore[index]
            for v in made
        )
    floor = {
        v["list"]: statistics.median(samples[v["table"]])
        for v in made
        if v["kind"] == "none"
    }
    for variant in made:
        variant["us_per_insert"] = round(
            statistics.median(samples[variant["table"]]), 1
        )
        variant["adds_us"] = round(variant["us_per_insert"] - floor[variant["list"]], 1)
        del variant["setup"]
    return {"inserts": inserts, "rounds": rounds, "rows_seen": rows,
            "variants": made}  # fmt: skip


def table(result: dict[str, Any]) -> str:
    lines = [
        "| list | values | check | µs per insert | adds |",
        "|---|---:|---|---:|---:|",
    ]
    for v in result["variants"]:
        adds = "-" if v["kind"] == "none" else f"{v['adds_us']:+.1f}"
        us = f"{v['us_per_insert']:.1f}"
        lines.append(f"| {v['list']} | {v['size']} | {v['kind']} | {us} | {adds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--inserts", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = run(args.database_url, inserts=args.inserts, rounds=args.rounds)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
