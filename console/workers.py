"""What the workers page shows: Celery's workers and queue, beat's jobs, the outboxes.

Three sources, each bounded in time:

- the broker (:func:`broker_answer`): the workers that answer a ``stats`` broadcast
  and the depth of the jobs' queue (a passive declare). Asked on a thread of its
  own with a deadline: a dead or silent broker makes the page say "no answer in
  1 s", never wait on it. At most ``MAX_ASKING`` asks run at once, so a hung broker
  cannot pile up threads; a request finding them all busy says so at once.
- the database: the last run of each job in beat's schedule (``portal_jobrun``,
  written by the worker that ran it, portal/jobruns.py) and whether it is late;
- the outbox depth per tenant, from ``console.dashboard.outbox_health`` (the one
  reader of it), for the tenants where the person manages the outbox.

Workers, the queue and beat serve every tenant, so only an operator (a superuser)
sees them; a tenant administrator sees the outbox of their own tenants only
(docs/portal.md, "The workers page").
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from django.conf import settings
from django.db import connection

from .dashboard import OutboxHealth

# How long the broker and the workers have to answer.
BROKER_TIMEOUT_S: Final = 1.0
# The thread's deadline past the broadcast's own timeout (connect + declare).
_SLACK_S: Final = 1.0
MAX_ASKING: Final = 2
_asking = threading.BoundedSemaphore(MAX_ASKING)


@dataclass(frozen=True, kw_only=True)
class WorkerRow:
    name: str
    pid: int | None
    concurrency: int | None
    uptime_s: int | None
    jobs_run: int  # since the worker started, every job name summed


@dataclass(frozen=True, kw_only=True)
class BrokerAnswer:
    """The broker's view, or why there is none (``note``)."""

    answered: bool
    note: str = ""
    queue: str = ""
    depth: int | None = None
    workers: list[WorkerRow] = field(default_factory=list)


def _workers(replies: Mapping[str, Any]) -> list[WorkerRow]:
    rows = []
    for name, reply in sorted(replies.items()):
        stats: dict[str, Any] = reply if isinstance(reply, dict) else {}
        pool: dict[str, Any] = stats.get("pool") or {}
        totals: dict[str, Any] = stats.get("total") or {}
        rows.append(
            WorkerRow(
                name=str(name),
                pid=stats.get("pid"),
                concurrency=pool.get("max-concurrency"),
                uptime_s=stats.get("uptime"),
                jobs_run=sum(int(n) for n in totals.values()),
            )
        )
    return rows


def _ask(app: Any, timeout_s: float) -> BrokerAnswer:
    """Connect, read the queue's depth, broadcast ``stats`` (blocking)."""
    queue = str(app.conf.task_default_queue)
    with app.connection_for_read(connect_timeout=timeout_s) as broker:
        broker.ensure_connection(max_retries=0)
        depth: int | None
        try:
            declared = broker.default_channel.queue_declare(queue=queue, passive=True)
            depth = int(declared.message_count)
        except Exception:  # noqa: BLE001 - no such queue yet, or no passive declare
            depth = None
        replies = app.control.inspect(timeout=timeout_s, connection=broker).stats()
    return BrokerAnswer(
        answered=True, queue=queue, depth=depth, workers=_workers(replies or {})
    )


def broker_answer(*, app: Any, timeout_s: float = BROKER_TIMEOUT_S) -> BrokerAnswer:
    """The workers that answer within ``timeout_s`` and the queue's depth; never
    blocks longer than ``timeout_s`` plus a second, whatever the broker does."""
    silent = f"no answer in {timeout_s:g} s"
    if not _asking.acquire(blocking=False):
        return BrokerAnswer(answered=False, note=f"{silent} (earlier asks still wait)")
    result: list[BrokerAnswer] = []

    def run() -> None:
        try:
            result.append(_ask(app, timeout_s))
        except Exception as error:  # noqa: BLE001 - any broker failure is "no answer"
            result.append(
                BrokerAnswer(
                    answered=False,
                    note=f"{silent}: {type(error).__name__}: {error}"[:300],
                )
            )
        finally:
            _asking.release()

    thread = threading.Thread(target=run, name="workers-page-broker", daemon=True)
    thread.start()
    thread.join(timeout_s + _SLACK_S)
    return result[0] if result else BrokerAnswer(answered=False, note=silent)


# --- beat's jobs, from the database ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BeatRow:
    entry: str  # the schedule's name, e.g. "reap-leases"
    job: str  # the job it sends, e.g. "tasks.jobs.reap_leases_job"
    every_s: float
    finished_at: dt.datetime | None
    outcome: str
    duration_ms: int | None
    worker: str
    error: str
    ago_s: float | None

    @property
    def every_label(self) -> str:
        """``5 s``, ``1 min``, ``6 h``, ``1 d``."""
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if self.every_s >= size and self.every_s % size == 0:
                return f"{self.every_s / size:g} {unit}"
        return f"{self.every_s:g} s"

    @property
    def late(self) -> bool:
        """No run within three intervals (and at least a minute): beat or every
        worker is down, or the job fails before it ends."""
        allowed = max(3 * self.every_s, self.every_s + 60)
        return self.ago_s is None or self.ago_s > allowed


def _every_s(schedule: Any) -> float:
    if isinstance(schedule, (int, float)):
        return float(schedule)
    run_every = getattr(schedule, "run_every", None)
    if isinstance(run_every, dt.timedelta):
        return run_every.total_seconds()
    return 0.0


def beat_rows(schedule: Mapping[str, Any] | None = None) -> list[BeatRow]:
    """Beat's schedule with each job's last run: one statement."""
    schedule = settings.CELERY_BEAT_SCHEDULE if schedule is None else schedule
    jobs = sorted({str(entry["task"]) for entry in schedule.values()})
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, finished_at, outcome, duration_ms, worker, error,"
            " EXTRACT(EPOCH FROM app_now() - finished_at)::float8"
            " FROM portal_jobrun WHERE name = ANY(%s)",
            [jobs],
        )
        runs = {row[0]: row[1:] for row in cursor.fetchall()}
    rows = []
    for entry, spec in schedule.items():
        job = str(spec["task"])
        finished_at, outcome, duration_ms, worker, error, ago_s = runs.get(
            job, (None, "", None, "", "", None)
        )
        rows.append(
            BeatRow(
                entry=entry,
                job=job,
                every_s=_every_s(spec.get("schedule")),
                finished_at=finished_at,
                outcome=outcome,
                duration_ms=duration_ms,
                worker=worker,
                error=error,
                ago_s=ago_s,
            )
        )
    return sorted(rows, key=lambda row: (row.every_s, row.entry))


# --- the page -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WorkersPage:
    """What one person sees: ``broker`` and ``beat`` for an operator only."""

    operator: bool
    broker: BrokerAnswer | None
    beat: list[BeatRow]
    outbox: list[OutboxHealth]

    @property
    def late_jobs(self) -> int:
        return sum(1 for row in self.beat if row.late)


def workers_page_get(
    *,
    operator: bool,
    outbox: Callable[[], Sequence[OutboxHealth]],
    app: Any,
) -> WorkersPage:
    """The page for an operator (``operator``) or a tenant administrator; the
    database is read before the broker is asked, so no statement waits on it."""
    rows = list(outbox())
    beat = beat_rows() if operator else []
    return WorkersPage(
        operator=operator,
        broker=broker_answer(app=app) if operator else None,
        beat=beat,
        outbox=rows,
    )
