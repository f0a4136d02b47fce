"""What a table CHECK costs a write, against a domain or a cheaper form of it.

    .venv/bin/python bench/value_checks.py [--database-url postgres://.../portal_bench_checks]
        [--inserts 20000] [--rounds 5] [--json PATH]

Makes an empty database (its name must contain "bench": it is dropped and made
again) with one small table per variant, then, in interleaved rounds, makes
``--inserts`` single-row INSERTs into each in a server-side PL/pgSQL loop (each
INSERT its own statement, as PostgreSQL counts them for CHECKs; no client round
trip or commit in the figure, so a loaded machine moves it little). PostgreSQL
parses a table CHECK from its stored text and plans it again in every statement
that writes the table (``ExecRelCheck``); a domain's CHECK is parsed once per
session and kept in the type cache. The groups and their variants:

- the closed lists (the 61 event codes and 20 reason codes as the migrations of
  issue 23 froze them, then the task and operation states, the outbox state and
  the actor type): ``none``, a ``varchar`` column with no check (the floor);
  ``table CHECK``, the list as Django writes ``Q(code__in=...)``; ``domain``, the
  column's type a domain with the same list (``portal/domains.py``);
- the event's id time (``audit_event_id_time_check``): ``none``; ``table CHECK,
  SQL function``, as migration audit/0011 wrote it (``audit_uuid7_time`` twice,
  an SQL function PostgreSQL inlines, so its body is planned again per statement);
  ``table CHECK, PL/pgSQL function``, as audit/0032 writes it (one call of
  ``audit_event_id_time_ok``, whose expression is planned once per session);
- the payload bound (``audit_event_payload_size_check``) on a 213-byte payload,
  an ``operation.reserved`` event's: ``none``, ``table CHECK``, ``domain`` over
  ``jsonb``;
- a non-negative integer (Django's ``PositiveIntegerField`` CHECK, five of them on
  the task and operation tables): ``none``, ``table CHECK``, ``domain``.

Every variant but the floor is shown to refuse a bad row first. Prints the median
µs per insert of each variant and what its check adds over its group's ``none``;
``--json`` writes them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
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

# An operation.reserved event's payload (213 bytes as text), and one over the bound.
PAYLOAD = (
    '{"action": "create_ticket", "target": "ticket-desk", "input_hash": '
    '"4dae4d36008beecbf0edc0af6837dabbb11da69b226fe8460e9760a085f3c0c1", '
    '"lease_token": 1, "idempotency_key": "24aa4669-reservation-1-service-r0-0-1"}'
)


def _migration(name: str) -> Any:
    return importlib.import_module(name)


def value_lists() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """name -> (base type, values, a valid value), as the migrations froze them."""
    events = _migration("audit.migrations.0027_reason_and_event_code_domains")
    reasons = _migration("portal.migrations.0014_reason_code_domain")
    states = _migration("tasks.migrations.0024_state_domains")
    audit = _migration("audit.migrations.0032_state_and_actor_type_domains")
    return {
        "event code": ("varchar(60)", events.EVENT_CODES, "task.transitioned"),
        "reason code": ("varchar(40)", reasons.REASON_CODES, "STALE_STATE"),
        "task state": ("varchar(20)", states.TASK_STATES, "waiting"),
        "operation state": ("varchar(20)", states.OPERATION_STATES, "executing"),
        "outbox state": ("varchar(10)", audit.OUTBOX_STATES, "pending"),
        "actor type": ("varchar(10)", audit.ACTOR_TYPES, "agent"),
    }


def _function(source: str, name: str) -> str:
    """The ``CREATE FUNCTION name(...) ... $$;`` statement in a migration's SQL."""
    found = re.search(
        rf"CREATE (?:OR REPLACE )?FUNCTION {name}\(.*?\$\$;", source, flags=re.DOTALL
    )
    if found is None:
        raise LookupError(name)
    return found.group(0)


def id_time_functions() -> list[str]:
    """The functions the id-time CHECKs call, as the migrations made them."""
    made = _migration("audit.migrations.0011_event_partitions").FUNCTIONS
    now = _migration("audit.migrations.0034_id_time_check_without_search_path")
    return [
        _function(made, "audit_uuid7_at"),
        _function(made, "audit_uuid7_time"),
        _function(now.ID_TIME_OK, "audit_event_id_time_ok"),
    ]


def _in_list(column: str, values: tuple[str, ...]) -> str:
    """The CHECK as Django's ``Q(column__in=values)`` makes it on a CharField."""
    items = ", ".join(f"'{v}'::varchar" for v in values)
    return f"(({column})::text = ANY ((ARRAY[{items}])::text[]))"


def _variant(
    group: str, size: int | None, kind: str, table: str, setup: list[str], **sql_: str
) -> dict[str, Any]:
    """``sql_``: ``insert`` (columns and VALUES of a good row), ``bad`` (of a row
    the check refuses, which the floor takes)."""
    return {"list": group, "size": size, "kind": kind, "table": table,
            "setup": setup, **sql_}  # fmt: skip


def list_variants() -> list[dict[str, Any]]:
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
                _variant(label, len(values), kind, table, setup,
                         insert=f"(v) VALUES ('{valid}')", bad="(v) VALUES ('made.up')")
            )  # fmt: skip
    return made


def id_time_variants() -> list[dict[str, Any]]:
    columns = "id uuid PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now()"
    checks = {
        "none": "",
        "table CHECK, SQL function": (
            ", CHECK (created_at > audit_uuid7_time(id) - interval '1 day'"
            " AND created_at < audit_uuid7_time(id) + interval '1 day')"
        ),
        "table CHECK, PL/pgSQL function": (
            ", CHECK (audit_event_id_time_ok(id, created_at, interval '1 day'))"
        ),
    }
    return [
        _variant(
            "id time", None, kind, f"i_{n}", [f"CREATE TABLE i_{n} ({columns}{check})"],
            insert="(id) VALUES (audit_uuid7_at(now()))",
            bad="(id, created_at)"
            " VALUES (audit_uuid7_at(now()), now() - interval '2 days')",
        )
        for n, (kind, check) in enumerate(checks.items())
    ]  # fmt: skip


def payload_variants() -> list[dict[str, Any]]:
    bound = _migration("audit.migrations.0002_invariants").EVENT_PAYLOAD_MAX_BYTES
    check = f"octet_length({{}}::text) <= {bound}"
    big = json.dumps({"blob": "x" * bound})
    setups = {
        "none": ["CREATE TABLE p_0 (id bigserial PRIMARY KEY, payload jsonb)"],
        "table CHECK": [
            "CREATE TABLE p_1 (id bigserial PRIMARY KEY, payload jsonb"
            f" CHECK ({check.format('payload')}))"
        ],
        "domain": [
            f"CREATE DOMAIN dpayload AS jsonb CHECK ({check.format('VALUE')})",
            "CREATE TABLE p_2 (id bigserial PRIMARY KEY, payload dpayload)",
        ],
    }
    return [
        _variant("payload size", None, kind, f"p_{n}", setup,
                 insert=f"(payload) VALUES ('{PAYLOAD}')",
                 bad=f"(payload) VALUES ('{big}')")
        for n, (kind, setup) in enumerate(setups.items())
    ]  # fmt: skip


def non_negative_variants() -> list[dict[str, Any]]:
    setups = {
        "none": ["CREATE TABLE n_0 (id bigserial PRIMARY KEY, v integer NOT NULL)"],
        "table CHECK": [
            "CREATE TABLE n_1 (id bigserial PRIMARY KEY, v integer NOT NULL"
            " CHECK (v >= 0))"
        ],
        "domain": [
            "CREATE DOMAIN dnonneg AS integer CHECK (VALUE >= 0)",
            "CREATE TABLE n_2 (id bigserial PRIMARY KEY, v dnonneg NOT NULL)",
        ],
    }
    return [
        _variant("non-negative integer", None, kind, f"n_{n}", setup,
                 insert="(v) VALUES (1)", bad="(v) VALUES (-1)")
        for n, (kind, setup) in enumerate(setups.items())
    ]  # fmt: skip


def variants() -> list[dict[str, Any]]:
    return [
        *list_variants(),
        *id_time_variants(),
        *payload_variants(),
        *non_negative_variants(),
    ]


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


def insert_us(conn: psycopg.Connection[Any], table: str, values: str, n: int) -> float:
    """µs per single-row INSERT statement, made ``n`` times in a PL/pgSQL loop."""
    loop = (
        f"DO $$ BEGIN FOR i IN 1..{int(n)} LOOP "
        f"INSERT INTO {table} {values}; END LOOP; END $$"
    )
    started = time.perf_counter()
    conn.execute(loop)
    return (time.perf_counter() - started) / n * 1e6


def run(database_url: str, *, inserts: int, rounds: int) -> dict[str, Any]:
    recreate(database_url)
    made = variants()
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in id_time_functions():
            conn.execute(statement)
        for variant in made:
            for statement in variant["setup"]:
                conn.execute(statement)
        # The walls hold: each check refuses its bad row; the floor takes it.
        for variant in made:
            try:
                conn.execute(f"INSERT INTO {variant['table']} {variant['bad']}")
            except psycopg.errors.CheckViolation:
                variant["refuses"] = True
            else:
                variant["refuses"] = False
        samples: dict[str, list[float]] = {v["table"]: [] for v in made}
        for _ in range(rounds):
            for variant in made:
                samples[variant["table"]].append(
                    insert_us(conn, variant["table"], variant["insert"], inserts)
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
        for key in ("setup", "insert", "bad"):
            del variant[key]
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
        size = "" if v["size"] is None else v["size"]
        lines.append(f"| {v['list']} | {size} | {v['kind']} | {us} | {adds} |")
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
