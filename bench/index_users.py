"""Every index of ``audit_outbox`` and ``audit_event`` next to the query that reads it.

    .venv/bin/python bench/index_users.py --database-url postgres://postgres@…/DB

Reads a database that already holds data (e.g. ``manage.py load_scale_data``; the
name must contain "bench" or "scale": it grants the app role its privileges there).
For each index it runs the query, page or job that needs it, as the app role in the
largest tenant's scope (row-level security on, as the portal runs), and prints
``EXPLAIN (ANALYZE, BUFFERS)`` (plain ``EXPLAIN`` for the writes, which are not run)
as a Markdown table: the index, its user, the plan line that names the index, the
buffers and time. A row whose plan does not name its index says so: that index is
either there for a constraint (uniqueness, a foreign key's target) or a candidate
to drop. docs/performance.md, "Every index pays for a query".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class Use:
    index: str
    user: str  # where in the code
    sql: str  # what runs (ORM queries as Django prints them)
    params: Any
    write: bool = False  # EXPLAIN only: not executed
    as_owner: bool = False  # PostgreSQL's RI checks run as the table's owner


def setup(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("PORTAL_DEV_MODE", "1")
    import django

    django.setup()


def orm(queryset: Any) -> tuple[str, Any]:
    from django.db import connection

    compiler = queryset.query.get_compiler(connection=connection)
    return compiler.as_sql()


def uses(sample: dict[str, Any]) -> list[Use]:
    from audit import relay
    from audit.models import Event, Outbox
    from console import dashboard

    t = sample["tenant"]
    out: list[Use] = []

    def add(index: str, user: str, query: Any, params: Any = None, **kw: Any) -> None:
        if not isinstance(query, str):
            query, params = orm(query)
        out.append(Use(index, user, query, params, **kw))

    # --- audit_outbox --------------------------------------------------------------
    add(
        "audit_outbox_pkey",
        "relay `_MARK_SENT` (a wave's rows by id)",
        relay._MARK_SENT,
        {"ids": sample["pending_ids"]},
        write=True,
    )
    add(
        "audit_outbox_pkey",
        "the outbox row's admin page (by id)",
        Outbox.objects.filter(tenant_id__in=[t], pk=sample["pending_ids"][0]),
    )
    add(
        "audit_outbox_due_idx",
        "relay `_CLAIM` (due heads, oldest first)",
        relay._CLAIM,
        {"limit": 200, "lease_s": 30.0},
        write=True,
    )
    add(
        "audit_outbox_task_unsent_idx",
        "relay `_CLAIM` (no older unsent row of the task; the followers)",
        relay._CLAIM,
        {"limit": 200, "lease_s": 30.0},
        write=True,
    )
    add(
        "audit_outbox_event_uniq",
        "retention purge (`audit_retention_purge`: a tenant's rows before an event)",
        "DELETE FROM audit_outbox o WHERE o.tenant_id = %s AND o.event_id < %s",
        [t, sample["event_mid"]],
        write=True,
    )
    add(
        "audit_outbox_event_uniq",
        "outbox admin search (a message by its key, the event id)",
        Outbox.objects.filter(tenant_id__in=[t], event_id=sample["key"]).order_by(
            "-pk"
        )[:100],
    )
    add(
        "audit_outbox_tenant_id_uniq",
        "outbox admin list, newest first (the tenant from row-level security)",
        Outbox.objects.filter(tenant_id__in=[t]).order_by("-pk")[:100],
    )
    add(
        "audit_outbox_tenant_id_uniq",
        "`audit.selectors.outbox_list` (a tenant's rows in id order)",
        Outbox.objects.filter(tenant_id=t).order_by("id")[:100],
    )
    health = dashboard._OUTBOX_HEALTH
    health_params = {"tenants": [t], "cap": 1000, "sample": 1000}
    add(
        "audit_outbox_unsent_state_idx",
        "outbox monitor (`console/dashboard.py`)",
        health,
        health_params,
    )
    add(
        "audit_outbox_sent_idx",
        "outbox monitor (`console/dashboard.py`)",
        health,
        health_params,
    )
    # --- audit_event ---------------------------------------------------------------
    add(
        "audit_event_pkey",
        "an event by id (event page, API)",
        Event.objects.filter(pk=sample["event_mid"]),
    )
    add(
        "audit_event_tenant_id_uniq",
        "the outbox's foreign key (RI check of every outbox insert)",
        "SELECT 1 FROM audit_event x WHERE tenant_id = %s AND id = %s"
        " FOR KEY SHARE OF x",
        [t, sample["event_mid"]],
        as_owner=True,
    )
    add(
        "audit_event_task_idx",
        "`audit.selectors.event_list(task_id=…)` (timeline)",
        Event.objects.filter(tenant_id=t, task_id=sample["task"]).order_by("id"),
    )
    add(
        "audit_event_operation_idx",
        "an operation's events (operation page)",
        Event.objects.filter(operation_id=sample["operation"]).order_by("id"),
    )
    add(
        "audit_event_created_idx",
        "event browser, newest first",
        Event.objects.filter(tenant_id__in=[t]).order_by("-created_at", "-id")[:100],
    )
    add(
        "audit_event_trace_idx",
        "search by trace id (`console/search.py`)",
        Event.objects.filter(trace_id=sample["trace"])[:100],
    )
    add(
        "audit_event_code_idx",
        "event browser, code filter",
        Event.objects.filter(tenant_id__in=[t], code=sample["rare_code"]).order_by(
            "-created_at", "-id"
        )[:100],
    )
    add(
        "audit_event_actor_idx",
        "event browser, actor filter",
        Event.objects.filter(
            tenant_id__in=[t], actor_type="agent", actor_id=sample["actor"]
        ).order_by("-created_at", "-id")[:100],
    )
    add(
        "audit_event_reason_idx",
        "event browser, reason filter",
        Event.objects.filter(tenant_id__in=[t], reason_code=sample["reason"]).order_by(
            "-created_at", "-id"
        )[:100],
    )
    return out


def sample_values(cursor: Any, *, smallest: bool) -> dict[str, Any]:
    def one(sql: str, *params: Any) -> Any:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        return row[0] if row else None

    tenant = one(
        "SELECT tenant_id FROM audit_event GROUP BY 1 ORDER BY count(*)"
        + ("" if smallest else " DESC")
        + " LIMIT 1"
    )
    cursor.execute(
        "SELECT id FROM audit_outbox WHERE tenant_id = %s ORDER BY id DESC LIMIT 50",
        [tenant],
    )
    return {
        "tenant": tenant,
        "pending_ids": [row[0] for row in cursor.fetchall()],
        "event_mid": one(
            "SELECT id FROM audit_event WHERE tenant_id = %s"
            " ORDER BY id OFFSET (SELECT count(*) / 2 FROM audit_event"
            " WHERE tenant_id = %s) LIMIT 1",
            tenant,
            tenant,
        ),
        "key": one("SELECT key FROM audit_outbox WHERE tenant_id = %s LIMIT 1", tenant),
        "task": one(
            "SELECT task_id FROM audit_event WHERE tenant_id = %s"
            " AND task_id IS NOT NULL LIMIT 1",
            tenant,
        ),
        "operation": one(
            "SELECT operation_id FROM audit_event WHERE tenant_id = %s"
            " AND operation_id IS NOT NULL LIMIT 1",
            tenant,
        ),
        "trace": one(
            "SELECT trace_id FROM audit_event WHERE tenant_id = %s"
            " AND trace_id <> '' LIMIT 1",
            tenant,
        ),
        "rare_code": one(
            "SELECT code FROM audit_event WHERE tenant_id = %s"
            " GROUP BY 1 ORDER BY count(*) LIMIT 1",
            tenant,
        ),
        "actor": one(
            "SELECT actor_id FROM audit_event WHERE tenant_id = %s"
            " AND actor_type = 'agent' LIMIT 1",
            tenant,
        ),
        "reason": one(
            "SELECT reason_code FROM audit_event WHERE tenant_id = %s"
            " AND reason_code IS NOT NULL GROUP BY 1 ORDER BY count(*) LIMIT 1",
            tenant,
        ),
    }


def explain(cursor: Any, use: Use, tenant: Any, role: str) -> list[str]:
    """The plan, as the app role in ``tenant``'s scope; nothing is kept."""
    from django.db import transaction

    options = "COSTS OFF" if use.write else "ANALYZE, BUFFERS, COSTS OFF"
    with transaction.atomic():
        if not use.as_owner:
            cursor.execute(f'SET LOCAL ROLE "{role}"')
        cursor.execute(
            "SELECT set_config('portal.tenant_ids', %s, true)", [str(tenant)]
        )
        cursor.execute(f"EXPLAIN ({options}) {use.sql}", use.params)
        plan = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    return plan


def evidence(plan: list[str], names: set[str]) -> tuple[str, str]:
    """The plan line naming the index (or one of its partitions' indexes), with its
    condition, and the totals."""
    found = ""
    named = r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b"
    for n, line in enumerate(plan):
        if re.search(named, line):
            found = line.strip().removeprefix("->").strip()
            for follow in plan[n + 1 : n + 3]:
                if "Index Cond" in follow:
                    found += "; " + follow.strip()
            break
    totals = [
        line.strip() for line in plan if line.strip().startswith(("Execution Time",))
    ]
    buffers = next((line.strip() for line in plan if "Buffers:" in line), "")
    return found, " ".join(filter(None, [buffers, *totals]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--json", type=Path, help="also write the plans here")
    parser.add_argument(
        "--smallest",
        action="store_true",
        help="the tenant with the fewest events (default: the most)",
    )
    args = parser.parse_args(argv)
    if not re.search(r"bench|scale", args.database_url.rsplit("/", 1)[-1]):
        parser.error("the database name must contain 'bench' or 'scale'")
    setup(args.database_url)
    from django.db import connection

    from portal import db_roles

    role = db_roles.APP_ROLE
    with connection.cursor() as cursor:
        cursor.execute(db_roles.APP_GRANTS.format(app=f'"{role}"'))
        sample = sample_values(cursor, smallest=args.smallest)
        cursor.execute("ANALYZE audit_outbox")
        rows: list[dict[str, str]] = []
        for use in uses(sample):
            plan = explain(cursor, use, sample["tenant"], role)
            # A partitioned table's index shows as its partitions' own indexes.
            cursor.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c"
                " ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
                [use.index],
            )
            names = {use.index, *(row[0] for row in cursor.fetchall())}
            line, totals = evidence(plan, names)
            rows.append(
                {
                    "index": use.index,
                    "user": use.user,
                    "plan": line or "NOT IN PLAN",
                    "totals": totals,
                    "full": "\n".join(plan),
                }
            )
    print("| index | read by | plan line | buffers, time |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| `{r['index']}` | {r['user']} | `{r['plan']}` | {r['totals']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
