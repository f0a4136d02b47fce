"""Admin pages at scale, as a reviewer of one tenant: one command, figures in docs/.

    .venv/bin/python bench/admin_pages.py
        [--database-url postgres://postgres@127.0.0.1:5432/portal_scale]
        [--tenant scale-t01] [--role reviewer] [--rounds 10] [--port 8765] [--no-docs]
        [--json reports/bench-admin-pages.json]

Runs against a database loaded with ``manage.py load_scale_data`` (it never loads or
changes data itself, except the ``audit.exported`` event each export writes). It
starts the portal under gunicorn (one sync worker, production-like: ``DEBUG`` off),
logs in over HTTP as ``reviewer-tNN`` of the tenant (default: the one with the most
tasks; ``--role support`` or ``admin`` logs in as ``support-tNN`` or ``admin-tNN``
instead, into a section of its own), and times, round after round, every admin page
that person can open:

- the admin index and every changelist the registry offers (pages that answer
  403 are listed as refused and not timed);
- the task page of a task with many events, operations and an escalation;
- the takeover desk, if the code has one (an admin whose name says takeover);
- an event search and a task search by that task's trace id;
- the start of an export (time to its first data row), if the code has one.

In the same run, the raw SQL each page cannot do without (the tenant's first page
of rows in the page's order, the task's rows, the trace's events, the first rows of
the export) is timed on a plain psycopg connection: the floor under each page.
Median and p95 are over ``--rounds`` rounds after one warm-up round; the order of
pages rotates each round so background load falls on all of them alike. Speed is
reported, not asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

# Run as a script: make the repository, not bench/, the first import root.
ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

import psycopg  # noqa: E402
import requests  # noqa: E402

from bench.report import replace_section  # noqa: E402

SECTION = "admin-pages"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/portal_scale"
BUDGET_MS = 300  # issue 8 §5: every page under 300 ms median at 10M events
PAGE_SIZE = 100  # Django's list_per_page default; the raw SQL reads as many
TABLES = (
    "portal_tenant",
    "tasks_task",
    "tasks_operation",
    "tasks_credential",
    "tasks_escalation",
    "audit_event",
    "audit_outbox",
)


@dataclass(kw_only=True)
class Target:
    """One page to time, and the raw SQL under it."""

    name: str
    path: str
    sql: str | None = None
    params: Sequence[Any] = ()
    first_row: bool = False  # time to its first data row (exports)
    http_ms: list[float] = field(default_factory=list)
    sql_ms: list[float] = field(default_factory=list)
    status: int | None = None
    size: int = 0
    note: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def gunicorn(*, env: dict[str, str], port: int) -> Iterator[str]:
    """The portal under gunicorn on 127.0.0.1:``port``, until the block ends."""
    command = [
        sys.executable, "-m", "gunicorn", "config.wsgi:application",
        "-b", f"127.0.0.1:{port}", "--workers", "1", "--timeout", "120",
        "--no-control-socket", "--log-level", "warning",
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"{base}/admin/login/", timeout=5)
                break
            except requests.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("gunicorn did not start") from None
                time.sleep(0.3)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def log_in(base: str, username: str, password: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{base}/admin/login/", timeout=30)
    answer = session.post(
        f"{base}/admin/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
            "next": "/admin/",
        },
        headers={"Referer": f"{base}/admin/login/"},
        allow_redirects=False,
        timeout=30,
    )
    if answer.status_code != 302:
        raise SystemExit(f"could not log in as {username} ({answer.status_code})")
    return session


def fetch(
    session: requests.Session, url: str, *, first_row: bool
) -> tuple[float, int, int]:
    """(ms, status, bytes): the whole page, or only until its first data row.

    A streamed export may send its header before it has read a row, so the time
    that counts is to the end of the second line (header and first row).
    """
    started = time.perf_counter()
    if first_row:
        with session.get(url, stream=True, timeout=300) as answer:
            seen = b""
            for chunk in answer.iter_content(256):
                seen += chunk
                if seen.count(b"\n") >= 2:
                    break
            elapsed = time.perf_counter() - started
            return elapsed * 1000, answer.status_code, len(seen)
    answer = session.get(url, timeout=300)
    elapsed = time.perf_counter() - started
    return elapsed * 1000, answer.status_code, len(answer.content)


def time_sql(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> float:
    started = time.perf_counter()
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        cursor.fetchall()
    return (time.perf_counter() - started) * 1000


# --- What to time --------------------------------------------------------------------


def _order_sql(model: Any, model_admin: Any) -> str:
    """The changelist's default order as SQL (Django falls back to ``-pk``)."""
    ordering = list(model_admin.ordering or model._meta.ordering or []) or ["-pk"]
    parts = []
    for item in ordering:
        if not isinstance(item, str):
            continue
        name = item.lstrip("-")
        column = (
            model._meta.pk.column
            if name == "pk"
            else model._meta.get_field(name).column
        )
        parts.append(f"{column} {'DESC' if item.startswith('-') else 'ASC'}")
    if "id" not in {p.split()[0] for p in parts}:
        parts.append("id DESC")
    return ", ".join(parts)


def _url_names(patterns: Sequence[Any], prefix: str = "") -> Iterator[str]:
    """Every named URL, with its namespaces (``admin:audit_event_export``)."""
    from django.urls import URLPattern, URLResolver

    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            namespace = f"{pattern.namespace}:" if pattern.namespace else ""
            yield from _url_names(pattern.url_patterns, prefix + namespace)
        elif isinstance(pattern, URLPattern) and pattern.name:
            yield prefix + pattern.name


def _reverse_export(name: str) -> str | None:
    """The export's URL: without arguments, or for CSV if it takes a format."""
    from django.urls import NoReverseMatch, reverse

    for args in ([], ["csv"]):
        try:
            return reverse(name, args=args)
        except NoReverseMatch:
            continue
    return None


def targets(*, tenant_id: str, task_id: str, trace_id: str) -> list[Target]:
    """Every page the bench asks for, found in the code as it is now."""
    from django.contrib import admin
    from django.urls import NoReverseMatch, get_resolver, reverse

    found = [Target(name="admin index", path=reverse("admin:index"))]
    takeover: list[Target] = []
    for model, model_admin in sorted(
        admin.site._registry.items(), key=lambda item: item[0]._meta.label
    ):
        meta = model._meta
        try:
            path = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        except NoReverseMatch:
            continue
        table = meta.db_table
        tenant_filter = (
            "id = %s"
            if meta.label == "portal.Tenant"
            else "tenant_id = %s"
            if any(f.name == "tenant" for f in meta.get_fields())
            else "TRUE"
        )
        if meta.proxy:
            # A proxy's own rows are narrowed by its admin's queryset; the raw
            # floor reads the concrete table in the same order.
            table = model._meta.concrete_model._meta.db_table  # type: ignore[union-attr]
        sql = (
            f"SELECT * FROM {table} WHERE {tenant_filter}"
            f" ORDER BY {_order_sql(model, model_admin)} LIMIT {PAGE_SIZE}"
        )
        params = [tenant_id] if tenant_filter != "TRUE" else []
        target = Target(name=f"{meta.label} list", path=path, sql=sql, params=params)
        if (
            "takeover" in (meta.model_name or "")
            or "takeover" in type(model_admin).__name__.lower()
        ):
            target.name = f"takeover desk ({meta.label})"
            target.sql = (
                "SELECT * FROM tasks_task WHERE tenant_id = %s"
                " AND state IN ('human_required', 'human_claimed')"
                f" ORDER BY updated_at DESC, id DESC LIMIT {PAGE_SIZE}"
            )
            takeover.append(target)
        else:
            found.append(target)
    if not takeover:
        found.append(Target(name="takeover desk", path="", note="not in this code"))
    found.extend(takeover)

    found.append(
        Target(
            name="task page (most events)",
            path=reverse("admin:tasks_task_change", args=[task_id]),
            sql=(
                "SELECT (SELECT count(*) FROM tasks_task"
                "    WHERE tenant_id = %s AND id = %s)"
                " + (SELECT count(*) FROM (SELECT * FROM audit_event"
                "    WHERE tenant_id = %s AND task_id = %s ORDER BY id) AS e)"
                " + (SELECT count(*) FROM (SELECT * FROM tasks_operation"
                "    WHERE tenant_id = %s AND task_id = %s) AS o)"
                " + (SELECT count(*) FROM (SELECT * FROM tasks_escalation"
                "    WHERE tenant_id = %s AND task_id = %s) AS x)"
            ),
            params=[tenant_id, task_id] * 4,
        )
    )
    events = reverse("admin:audit_event_changelist")
    found.append(
        Target(
            name="event search by trace id",
            path=f"{events}?{urlencode({'q': trace_id})}",
            sql=(
                "SELECT * FROM audit_event WHERE tenant_id = %s AND trace_id = %s"
                f" ORDER BY id DESC LIMIT {PAGE_SIZE}"
            ),
            params=[tenant_id, trace_id],
        )
    )
    tasks = reverse("admin:tasks_task_changelist")
    found.append(
        Target(
            name="task search by trace id",
            path=f"{tasks}?{urlencode({'q': trace_id})}",
            sql=(
                "SELECT * FROM tasks_task WHERE tenant_id = %s AND trace_id = %s"
                f" ORDER BY id DESC LIMIT {PAGE_SIZE}"
            ),
            params=[tenant_id, trace_id],
        )
    )
    # An export: any URL named like one, without arguments or for CSV; the whole
    # trail of the reviewer's tenant, of which only the start is timed.
    for name in sorted(set(_url_names(get_resolver().url_patterns))):
        if "export" not in name.rsplit(":", 1)[-1]:
            continue
        export_path = _reverse_export(name)
        if export_path is None:
            continue
        found.append(
            Target(
                name=f"export start ({name.rsplit(':', 1)[-1]}, CSV, whole tenant)",
                path=export_path,
                first_row=True,
                sql=(
                    "SELECT * FROM audit_event WHERE tenant_id = %s"
                    " ORDER BY id LIMIT 1000"
                ),
                params=[tenant_id],
            )
        )
    if not any(t.first_row for t in found):
        found.append(Target(name="export start", path="", note="not in this code"))
    return found


# --- The run -------------------------------------------------------------------------


def _scalar(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()) -> Any:
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


def _subject(conn: psycopg.Connection[Any], slug: str | None) -> tuple[str, str]:
    """(tenant id, slug): the given tenant, or the one with the most tasks."""
    if slug:
        tenant_id = _scalar(
            conn, "SELECT id::text FROM portal_tenant WHERE slug = %s", [slug]
        )
        if tenant_id is None:
            raise SystemExit(f"no tenant {slug!r}; load data with load_scale_data")
        return tenant_id, slug
    row = _scalar(
        conn,
        """
        SELECT t.id::text || ' ' || t.slug FROM portal_tenant AS t
        WHERE t.slug LIKE 'scale-t%%'
        ORDER BY (SELECT count(*) FROM tasks_task AS k WHERE k.tenant_id = t.id) DESC
        LIMIT 1
        """,
    )
    if row is None:
        raise SystemExit("no scale-tNN tenant; load data with load_scale_data first")
    tenant_id, slug = row.split(" ", 1)
    return tenant_id, slug


def _rich_task(conn: psycopg.Connection[Any], tenant_id: str) -> tuple[str, str]:
    """(task id, trace id) of a task with an escalation and the most events."""
    row = _scalar(
        conn,
        """
        SELECT x.task_id::text FROM tasks_escalation AS x
        WHERE x.tenant_id = %s
        ORDER BY (SELECT count(*) FROM audit_event AS e
                  WHERE e.tenant_id = x.tenant_id AND e.task_id = x.task_id) DESC,
                 x.task_id
        LIMIT 1
        """,
        [tenant_id],
    )
    if row is None:
        row = _scalar(
            conn,
            "SELECT id::text FROM tasks_task WHERE tenant_id = %s LIMIT 1",
            [tenant_id],
        )
    trace = _scalar(conn, "SELECT trace_id FROM tasks_task WHERE id = %s", [row])
    return row, trace


def _setting(conn: psycopg.Connection[Any], name: str) -> str:
    return str(_scalar(conn, f"SHOW {name}"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["PORTAL_NO_BOOTSTRAP"] = "1"
    # The loaded data set is a development one: its users have published passwords.
    os.environ["PORTAL_DEV_MODE"] = "1"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from config.scale_data.rows import PASSWORD

    started_at = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    load_start = os.getloadavg()
    conn = psycopg.connect(args.database_url, autocommit=True)
    tenant_id, slug = _subject(conn, args.tenant)
    task_id, trace_id = _rich_task(conn, tenant_id)
    username = f"{args.role}-{slug.removeprefix('scale-')}"
    pages = targets(tenant_id=tenant_id, task_id=task_id, trace_id=trace_id)
    timed = [p for p in pages if p.path]
    env = {**os.environ, "DJANGO_DEBUG": "0"}
    env.pop("DJANGO_SECRET_KEY", None)
    with gunicorn(env=env, port=args.port or _free_port()) as base:
        session = log_in(base, username, PASSWORD)
        pages_in_turn = [p for p in timed if not p.first_row]
        exports = [p for p in timed if p.first_row]
        for round_no in range(args.rounds + 1):
            shift = round_no % len(pages_in_turn)
            # Exports last: an abandoned stream may keep the one worker busy for a
            # moment, and the untimed request after it waits that out.
            in_order = pages_in_turn[shift:] + pages_in_turn[:shift] + exports
            for page in in_order:
                if page.status is not None and page.status != 200:
                    continue  # refused in the warm-up: not this person's page
                ms, status, size = fetch(
                    session, base + page.path, first_row=page.first_row
                )
                if page.first_row:
                    session.get(f"{base}/admin/login/", timeout=300)
                sql_ms = time_sql(conn, page.sql, page.params) if page.sql else None
                page.status = status
                if round_no == 0:
                    continue  # warm-up
                page.http_ms.append(ms)
                page.size = size
                if sql_ms is not None:
                    page.sql_ms.append(sql_ms)
            print(f"admin_pages: round {round_no}/{args.rounds} done", file=sys.stderr)
    counts = {table: _scalar(conn, f"SELECT count(*) FROM {table}") for table in TABLES}
    tenant_counts = {
        table: _scalar(
            conn, f"SELECT count(*) FROM {table} WHERE tenant_id = %s", [tenant_id]
        )
        for table in ("tasks_task", "audit_event", "audit_outbox")
    }
    meta = {
        "started_at": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(time.monotonic() - started),
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "nproc": os.cpu_count(),
        "machine": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "postgres": _scalar(conn, "SELECT version()").split(" on ")[0],
        "database": args.database_url.rsplit("/", 1)[-1],
        "database_size": _scalar(
            conn, "SELECT pg_size_pretty(pg_database_size(current_database()))"
        ),
        "settings": {
            name: _setting(conn, name)
            for name in ("shared_buffers", "work_mem", "autovacuum", "jit")
        },
        "counts": counts,
        "tenant": slug,
        "tenant_counts": tenant_counts,
        "username": username,
        "role": args.role,
        "task_id": task_id,
        "trace_id": trace_id,
        "rounds": args.rounds,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
    }
    conn.close()
    return {"meta": meta, "pages": pages}


def _ms(values: Sequence[float], q: float | None = None) -> str:
    if not values:
        return "-"
    value = statistics.median(values) if q is None else percentile(values, q)
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def table(pages: Sequence[Target]) -> str:
    lines = [
        "| page | URL | status | median ms | p95 ms | KB | raw SQL median / p95 ms "
        f"| under {BUDGET_MS} ms |",
        "|---|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for page in pages:
        path = page.path.replace("|", "%7C")
        if len(path) > 60:
            path = path[:57] + "…"
        if not page.path:
            lines.append(f"| {page.name} | - | {page.note} | | | | | |")
            continue
        if page.status != 200 or not page.http_ms:
            lines.append(
                f"| {page.name} | `{path}` | {page.status} (refused) | | | | | |"
            )
            continue
        median = statistics.median(page.http_ms)
        budget = "yes" if median < BUDGET_MS else "**no**"
        size = "first row" if page.first_row else f"{page.size / 1024:,.0f}"
        raw = f"{_ms(page.sql_ms)} / {_ms(page.sql_ms, 95)}" if page.sql_ms else "-"
        lines.append(
            f"| {page.name} | `{path}` | {page.status} | **{_ms(page.http_ms)}** "
            f"| {_ms(page.http_ms, 95)} | {size} | {raw} | {budget} |"
        )
    return "\n".join(lines)


def markdown_section(meta: dict[str, Any], pages: Sequence[Target]) -> str:
    counts = ", ".join(f"{table} {count:,}" for table, count in meta["counts"].items())
    tenant = ", ".join(
        f"{table} {count:,}" for table, count in meta["tenant_counts"].items()
    )
    settings = ", ".join(f"`{k}={v}`" for k, v in meta["settings"].items())
    timed = [p for p in pages if p.http_ms and p.status == 200]
    over = [p.name for p in timed if statistics.median(p.http_ms) >= BUDGET_MS]
    verdict = (
        f"All {len(timed)} pages the {meta['role']} can open answer in under "
        f"{BUDGET_MS} ms "
        "median."
        if not over
        else f"{len(over)} of {len(timed)} pages are over the {BUDGET_MS} ms median "
        f"budget: {', '.join(over)}."
    )
    load_start = " / ".join(f"{v:.1f}" for v in meta["load_start"])
    load_end = " / ".join(f"{v:.1f}" for v in meta["load_end"])
    rights = {
        "reviewer": "view and export the trail of that one tenant",
        "support": "view the trail and work the takeover desk of that one tenant",
        "admin": "every tenant permission in that one tenant",
    }[meta["role"]]
    role_flag = "" if meta["role"] == "reviewer" else f" --role {meta['role']}"
    article = "an" if meta["role"] == "admin" else "a"
    return f"""## Admin pages at scale, as {article} {meta["role"]} of one tenant

Generated by `bench/admin_pages.py` on {meta["started_at"]} (run took
{meta["seconds"]} s, code at `{meta["commit"]}`); do not edit between the markers,
run the command again:

```
manage.py load_scale_data --tasks 1000000 --events 10000000 --tenants 20  # once
.venv/bin/python bench/admin_pages.py{role_flag} --database-url \\
    postgres://postgres@127.0.0.1:5432/{meta["database"]}
```

{verdict}

Setup:

- Data (`load_scale_data`, database `{meta["database"]}`, {meta["database_size"]}):
  {counts}. The person's tenant `{meta["tenant"]}` (the largest): {tenant}.
- Logged in over HTTP as `{meta["username"]}` ({meta["role"]} role: {rights}),
  against gunicorn with one sync worker, `DEBUG` off,
  on the same host as PostgreSQL. Task page: `{meta["task_id"]}` (an escalated
  task with the most events); searches use its trace id `{meta["trace_id"]}`.
- {meta["rounds"]} rounds after one warm-up round; each round requests every page
  once, in an order rotated each round. Median and p95 (nearest rank) over the
  rounds. An export (the person's whole tenant, CSV) is timed to its first data
  row (header and one row), then abandoned; it comes last in each round.
- Raw SQL: on a plain psycopg connection in the same run, after each request, the
  rows the page cannot do without: its first {PAGE_SIZE} rows of the tenant in the
  changelist's default order, the task's own rows (task, events, operations,
  escalations), the trace's events, the first 1,000 rows of an export. It is the
  floor under each page, not what the page runs.
- {meta["nproc"]} CPUs, {meta["machine"]}, 1-minute / 5-minute / 15-minute load
  average {load_start} at the start and {load_end} at the end (the machine is
  shared). {meta["postgres"]}: {settings}. Python {meta["python"]}.

{table(pages)}
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else ""
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--tenant", default=None, help="slug (default: the largest)")
    parser.add_argument(
        "--role", choices=("reviewer", "support", "admin"), default="reviewer"
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not re.search(r"/[\w-]+$", args.database_url):
        raise SystemExit("--database-url must name a database")
    result = run(args)
    meta, pages = result["meta"], result["pages"]
    body = markdown_section(meta, pages)
    print(body)
    if not args.no_docs:
        section = SECTION if args.role == "reviewer" else f"{SECTION}-{args.role}"
        replace_section(ROOT / "docs" / "performance.md", body, section=section)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "meta": meta,
                    "pages": [
                        {
                            "name": p.name,
                            "path": p.path,
                            "status": p.status,
                            "http_ms": p.http_ms,
                            "sql_ms": p.sql_ms,
                            "first_row": p.first_row,
                            "note": p.note,
                        }
                        for p in pages
                    ],
                },
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
