"""Time the reviewer's pages (event browser, task list, task page, export start).

Usage, against a loaded database (e.g. bench/story_load.sql: 10 tenants, 100k
tasks, 1M events)::

    DATABASE_URL=postgres://…/story_explain PORTAL_NO_BOOTSTRAP=1 \\
        python -m bench.story_pages [--plans]

Logs in as a reviewer of tenant ``bench-1`` (made on first run) and prints, per
page, the median of five requests, the number of queries and the slowest one
(with its plan when ``--plans``), then the time to the first rows of an export.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("PORTAL_DEV_MODE", "1")  # benchmarks run the dev setup
django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from portal import services as portal_services  # noqa: E402
from portal.models import Role, Tenant  # noqa: E402
from tasks.models import Task  # noqa: E402

EVENTS = "/admin/audit/event/"


def main(plans: bool) -> None:
    tenant = Tenant.objects.get(slug="bench-1")
    user, created = User.objects.get_or_create(
        username="bench-reviewer", defaults={"is_staff": True}
    )
    if created:
        portal_services.membership_grant(tenant=tenant, user=user, role=Role.REVIEWER)
    task = Task.objects.filter(tenant=tenant).order_by("id")[500]
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    day = {"created_from": "2026-11-20", "created_to": "2026-11-20"}
    cases: dict[str, tuple[str, dict[str, str]]] = {
        "event list": (EVENTS, {}),
        "event search trace": (EVENTS, {"q": task.trace_id}),
        "event search object id": (EVENTS, {"q": task.object_id}),
        "event search task id": (EVENTS, {"q": str(task.pk)}),
        "event filter task": (EVENTS, {"task": str(task.pk)}),
        "event filter code": (EVENTS, {"code__exact": "task.human_claimed"}),
        "event range 1 day": (EVENTS, day),
        "event filter actor": (EVENTS, {"actor": "bench"}),
        "task list": ("/admin/tasks/task/", {}),
        "task search trace": ("/admin/tasks/task/", {"q": task.trace_id}),
        "task search object": ("/admin/tasks/task/", {"q": task.object_id}),
        "task page": (f"/admin/tasks/task/{task.pk}/change/", {}),
    }
    for name, (url, params) in cases.items():
        times = []
        for _ in range(5):
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get(url, params)
                times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (name, response.status_code)
        slowest = max(queries.captured_queries, key=lambda q: float(q["time"]))
        print(
            f"{name:24s} median {statistics.median(times):7.1f} ms, "
            f"{len(queries.captured_queries):2d} queries, slowest "
            f"{float(slowest['time']) * 1000:.1f} ms"
        )
        if plans:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN " + slowest["sql"])
                print("    " + "\n    ".join(row[0] for row in cursor.fetchall()[:8]))
    started = time.perf_counter()
    response = client.get(f"{EVENTS}export/csv/")
    chunks = iter(response.streaming_content)  # type: ignore[attr-defined]
    next(chunks)  # the header
    next(chunks)  # the first rows
    print(f"export first rows        {(time.perf_counter() - started) * 1000:7.1f} ms")
    response.close()


if __name__ == "__main__":
    main(plans="--plans" in sys.argv)
