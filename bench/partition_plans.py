"""The event browser's query plans on month partitions (docs/retention.md).

    .venv/bin/python bench/partition_plans.py [--database-url postgres://...]
        [--events-per-month 20000]

Drops, creates and migrates its own database (default portal_bench_plans; the name
must contain "bench"), lays ``audit_event`` out in whole months (twelve back to
three ahead), loads one tenant's events spread over the past months, and prints
``EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)`` of the event browser's
queries, as the admin's created-range filter builds them, in Markdown.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.service_layer import recreate_database  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal_bench_plans"


def add_months(day: dt.date, months: int) -> dt.date:
    index = day.year * 12 + day.month - 1 + months
    return dt.date(index // 12, index % 12 + 1, 1)


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/partition_plans.py")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--events-per-month", type=int, default=20000)
    args = parser.parse_args()
    recreate_database(args.database_url)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("PORTAL_DEV_MODE", "1")
    os.environ["DATABASE_URL"] = args.database_url
    import django

    django.setup()
    from django.db import connection

    from audit import selectors as audit_selectors
    from audit.models import Event
    from portal.models import Tenant

    this_month = dt.datetime.now(dt.UTC).date().replace(day=1)
    tenant = Tenant.objects.create(slug="plans", name="Plans")
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM audit_event_partitions()")
        for (name,) in cursor.fetchall():
            cursor.execute(f'ALTER TABLE audit_event DETACH PARTITION "{name}"')
            cursor.execute(f'DROP TABLE "{name}"')
        for k in range(-12, 4):
            cursor.execute(
                "SELECT audit_event_partition_create(%s)", [add_months(this_month, k)]
            )
        for k in range(-12, 0):
            start = add_months(this_month, k)
            cursor.execute(
                """
                INSERT INTO audit_event (id, tenant_id, task_id, code, actor_type,
                    actor_id, payload, trace_id, span_id, created_at)
                SELECT audit_uuid7_at(t), %(tenant)s, gen_random_uuid(),
                    'task.transitioned', 'system', 'plans', '{}', '', '', t
                FROM (SELECT %(start)s::timestamptz
                        + (%(span)s::interval * i / %(n)s) AS t
                      FROM generate_series(0, %(n)s - 1) AS i) AS times
                """,
                {
                    "tenant": tenant.pk,
                    "start": dt.datetime.combine(start, dt.time(), dt.UTC),
                    "span": f"{(add_months(start, 1) - start).days} days",
                    "n": args.events_per_month,
                },
            )
        cursor.execute("VACUUM (ANALYZE) audit_event")

    def show(title: str, queryset: object) -> None:
        sql, params = queryset.query.sql_with_params()  # type: ignore[attr-defined]
        with connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql, params
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        print(f"#### {title}\n\n```\n{plan}\n```\n")

    month = add_months(this_month, -3)
    browse = Event.objects.filter(tenant=tenant).order_by("-created_at", "-id")
    first_week = audit_selectors.event_created_range(
        created_from=dt.datetime.combine(month, dt.time(), dt.UTC)
        + dt.timedelta(days=7),
        created_to=dt.datetime.combine(month, dt.time(), dt.UTC)
        + dt.timedelta(days=14),
    )
    show(
        f"Created from {month + dt.timedelta(days=7)} until "
        f"{month + dt.timedelta(days=14)}: one partition",
        browse.filter(first_week)[:100],
    )
    across = audit_selectors.event_created_range(
        created_from=dt.datetime.combine(month, dt.time(), dt.UTC)
        - dt.timedelta(days=3),
        created_to=dt.datetime.combine(month, dt.time(), dt.UTC) + dt.timedelta(days=3),
    )
    show(
        f"Created across the start of {month:%Y-%m}: two partitions",
        browse.filter(across)[:100],
    )
    show(
        "No created range (the browser's first page): every partition, newest "
        "first, each a short backward index scan",
        browse[:100],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
