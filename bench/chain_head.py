"""What finding a chain's head costs an append, before and after the head row.

    .venv/bin/python bench/chain_head.py [--database-url postgres://.../portal_bench_chainhead]
        [--partitions 27] [--lookups 20000] [--appends 2000] [--rounds 3]

Makes two databases from the URL's name (``…_before`` migrated up to audit 0013:
the head read from ``audit_event`` under an advisory lock; ``…_after`` up to audit
0016: the ``audit_chainhead`` row and its insert trigger, migration 0014; since 0017
the append's own statement moves the row, see docs/audit-integrity.md), each
laid out with ``--partitions`` month partitions and one task chain of 50 events.
Then, in alternating rounds on both, as the app role in the tenant's scope:

1. ``--lookups`` calls of ``audit_event_chain_head`` in one PL/pgSQL loop;
2. ``--appends`` chained inserts as ``event_append``'s statement makes them (head,
   hash, insert; the trigger where there is one), in one loop, rolled back.

Prints µs per call of each, per round, and the after/before ratio of the medians.
Server-side loops: no client round trips in the figures. Names must contain
"bench" (the databases are dropped and re-created).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.service_layer import recreate_database  # noqa: E402
from portal import db_roles  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal_bench_chainhead"

SETUP = """
CREATE FUNCTION pg_temp.heads(p_tenant uuid, p_task uuid, p_n int)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE s bigint; h text;
BEGIN
    FOR i IN 1..p_n LOOP
        SELECT head_seq, head_hash INTO s, h
        FROM audit_event_chain_head(p_tenant, p_task);
    END LOOP;
END $$;
CREATE FUNCTION pg_temp.appends(p_tenant uuid, p_task uuid, p_n int)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..p_n LOOP
        INSERT INTO audit_event (id, tenant_id, task_id, code, actor_type, actor_id,
            payload, payload_digest, trace_id, span_id, created_at, chain_seq,
            prev_hash, hash)
        SELECT audit_uuid7_at(clock_timestamp()), p_tenant, p_task,
            'task.transitioned', 'system', 'bench', '{}', repeat('0', 64), '', '',
            now(), COALESCE(head.head_seq, 0) + 1, head.head_hash,
            encode(sha256(convert_to(COALESCE(head.head_hash, repeat('0', 64))
                || i::text, 'UTF8')), 'hex')
        FROM audit_event_chain_head(p_tenant, p_task) AS head;
    END LOOP;
END $$;
"""


def prepare(admin_url: str, *, partitions: int, audit_target: str | None) -> str:
    """A fresh database at the given audit migration; its app-role URL."""
    app_url = recreate_database(admin_url)
    owner_url = db_roles.url_as(admin_url, user=db_roles.OWNER_ROLE)
    if audit_target:
        import os
        import subprocess

        # Back to the target as the owner alone: with the app role as DATABASE_URL,
        # migrate re-applies its grants afterwards, and they name tables (the
        # transparency log's, audit 0021) that the older schema does not have. The
        # full migrate has granted the app role what the older schema keeps.
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "audit", audit_target,
             "--no-input", "--verbosity", "0"],
            cwd=Path(__file__).resolve().parent.parent,
            env={**os.environ, "DATABASE_URL": owner_url, "DATABASE_OWNER_URL": "",
                 "PORTAL_NO_BOOTSTRAP": "1", "PORTAL_DEV_MODE": "1"},
            check=True,
        )  # fmt: skip
    with psycopg.connect(owner_url, autocommit=True) as conn:
        have = conn.execute("SELECT count(*) FROM audit_event_partitions()").fetchone()
        missing = partitions - int(have[0] if have else 0)
        conn.execute(
            "SELECT audit_event_partition_create((date_trunc('month', now())"
            " + make_interval(months => 4 + k))::date)"
            " FROM generate_series(0, %s - 1) AS k",
            [max(missing, 0)],
        )
        tenant = conn.execute(
            "INSERT INTO portal_tenant (id, slug, name, events_on_delete, created_at)"
            " VALUES (gen_random_uuid(), 'bench', 'Bench', 'keep', now()) RETURNING id"
        ).fetchone()
    assert tenant is not None
    with psycopg.connect(app_url, autocommit=True) as conn:
        with conn.transaction():
            scope(conn, tenant[0])
            conn.execute(SETUP)
            conn.execute("SELECT pg_temp.appends(%s, %s, 50)", [tenant[0], TASK])
        conn.execute("ANALYZE audit_event")
    return app_url


TASK = "01a23456-0000-7000-8000-000000000001"


def scope(conn: psycopg.Connection[Any], tenant_id: object) -> None:
    conn.execute("SELECT set_config('portal.tenant_ids', %s, true)", [str(tenant_id)])


def timed(
    conn: psycopg.Connection[Any], statement: str, args: list[Any], n: int
) -> float:
    """µs per call of one server-side loop of n, rolled back."""
    with conn.transaction(force_rollback=True):
        tenant = conn.execute(
            "SELECT id FROM portal_tenant WHERE slug = 'bench'"
        ).fetchone()
        assert tenant is not None
        scope(conn, tenant[0])
        conn.execute(SETUP)
        start = time.perf_counter()
        conn.execute(statement, [tenant[0], TASK, *args])
        return (time.perf_counter() - start) * 1e6 / n


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/chain_head.py")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--partitions", type=int, default=27)
    parser.add_argument("--lookups", type=int, default=20000)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    urls = {
        variant: prepare(
            f"{args.database_url}_{variant}",
            partitions=args.partitions,
            audit_target=target,
        )
        for variant, target in (("before", "0013"), ("after", "0016"))
    }
    results: dict[str, dict[str, list[float]]] = {
        v: {"lookup": [], "append": []} for v in urls
    }
    for round_no in range(1, args.rounds + 1):
        for variant, url in urls.items():
            with psycopg.connect(url) as conn:
                lookup = timed(conn, "SELECT pg_temp.heads(%s, %s, %s)",
                               [args.lookups], args.lookups)  # fmt: skip
                append = timed(conn, "SELECT pg_temp.appends(%s, %s, %s)",
                               [args.appends], args.appends)  # fmt: skip
            results[variant]["lookup"].append(lookup)
            results[variant]["append"].append(append)
            print(f"round {round_no} {variant:>6}: head lookup {lookup:7.1f} µs,"
                  f" chained insert {append:7.1f} µs", flush=True)  # fmt: skip
    for kind in ("lookup", "append"):
        before = statistics.median(results["before"][kind])
        after = statistics.median(results["after"][kind])
        print(f"{kind}: median before {before:.1f} µs, after {after:.1f} µs,"
              f" after/before {after / before:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
