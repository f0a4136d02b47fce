"""The load: chunks of tasks COPYed by writer threads, one transaction per chunk,
with progress on stderr."""

from __future__ import annotations

import datetime as dt
import functools
import math
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connection, transaction

from portal import scope

from .rows import (
    CHUNK_TASKS,
    HISTORY,
    MAX_EVENTS_PER_TASK,
    MIN_EVENTS_PER_TASK,
    STATE_MIX,
    TABLES,
    Chunk,
    Ids,
)
from .stories import event_count, task_story
from .tenants import tenants_set_up


@dataclass(kw_only=True)
class LoadSummary:
    tasks: int = 0
    events: int = 0
    outbox: int = 0
    operations: int = 0
    escalations: int = 0
    credentials: int = 0
    seconds: float = 0.0


class Progress:
    """A progress line on stderr: count, share, rate and time left.

    On a terminal the line is redrawn in place (at most 4 times a second); in a log
    file a new line is written every ``log_every_s`` seconds, and at the end.
    """

    def __init__(
        self,
        *,
        total: int,
        unit: str,
        write: Callable[[str], object],
        tty: bool,
        log_every_s: float = 5.0,
    ) -> None:
        self.total = max(total, 1)
        self.unit = unit
        self.write = write
        self.tty = tty
        self.done = 0
        self.started = time.monotonic()
        self._last = 0.0
        self._every = 0.25 if tty else log_every_s

    def advance(self, count: int, *, final: bool = False) -> None:
        self.done += count
        now = time.monotonic()
        if not final and now - self._last < self._every:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else math.inf
        eta = "--" if math.isinf(left) else duration(left)
        line = (
            f"load_scale_data: {self.done:,}/{self.total:,} {self.unit} "
            f"({100 * self.done / self.total:5.1f} %), {rate:,.0f} {self.unit}/s, "
            f"elapsed {duration(elapsed)}, ETA {eta}"
        )
        if self.tty:
            self.write("\r" + line + ("\n" if final else ""))
        else:
            self.write(line + "\n")


def duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


# --- The load ------------------------------------------------------------------------


def _counts() -> tuple[int, int]:
    """Tasks and events in the whole database: every tenant's, whatever the scope
    (a command starts with none, which would count nothing)."""
    with scope.every_tenant(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM tasks_task),"
            " (SELECT count(*) FROM audit_event)"
        )
        tasks, events = cursor.fetchone()
    return int(tasks), int(events)


def _created_at(
    rng: random.Random, *, state: str, slot: int, slots: int, now: dt.datetime
) -> dt.datetime:
    """When the task was registered.

    Finished tasks in time order over 90 days. Unfinished ones over the time they
    plausibly stay unfinished: running within the hour (their leases are live),
    pending within two days, waiting within a week, escalations within two weeks;
    so the last day holds about twice the average day's events, not a burst.
    """
    recent = {
        "running": 3600,
        "pending": 2 * 86400,
        "waiting": 7 * 86400,
        "human_required": 14 * 86400,
        "human_claimed": 14 * 86400,
    }.get(state)
    if recent is not None:
        return now - dt.timedelta(seconds=rng.uniform(60, recent))
    offset = (slot + rng.random()) * (HISTORY.total_seconds() - 60) / slots
    return now - HISTORY + dt.timedelta(seconds=offset)


@functools.cache
def _row_level_secured() -> frozenset[str]:
    """The loaded tables under row-level security, which refuses ``COPY FROM``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relrowsecurity AND relname = ANY(%s)",
            [[table for table, _ in TABLES]],
        )
        return frozenset(name for (name,) in cursor.fetchall())


def _copy(chunk: Chunk) -> None:
    """COPY the chunk's rows, parents first, in the caller's transaction.

    A table under row-level security is copied into a temporary table first and
    inserted from there, so its policy checks every row (tenant scope of ``load``).
    """
    secured = _row_level_secured()
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg cursor under Django's wrapper
        for table, columns in TABLES:
            rows = chunk.rows[table]
            if not rows:
                continue
            names = ", ".join(columns)
            target = table
            if table in secured:
                target = f"load_{table}"
                raw.execute(
                    f"CREATE TEMP TABLE IF NOT EXISTS {target} "
                    f"(LIKE {table}) ON COMMIT DELETE ROWS"
                )
            # Same-tenant children need their parent rows first: one table at a
            # time keeps every composite foreign key satisfied row by row.
            with raw.copy(f"COPY {target} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            if target != table:
                raw.execute(
                    f"INSERT INTO {table} ({names}) SELECT {names} FROM {target}"
                )


def load(
    *,
    tasks: int,
    events: int,
    tenants: int,
    outbox: int | None = None,
    seed: int = 8,
    append: bool = False,
    report: Callable[[str], None] = lambda line: None,
    progress: Callable[[str], object] = sys.stderr.write,
    progress_tty: bool = False,
    chunk_tasks: int = CHUNK_TASKS,
    writers: int = 2,
) -> LoadSummary:
    """Load tasks and their stories until the database holds ``tasks``/``events``.

    With ``append``, add that many on top instead. Each chunk of tasks (with all
    its rows) commits on its own; with ``writers`` > 0 the chunks are written by
    that many threads on connections of their own, so they do not join the
    caller's transaction (a test that wants them rolled back passes
    ``writers=0``).

    Raises:
        CommandError: production settings; the database already holds that many
            rows (without ``append``); counts that cannot give 5-15 events a task.
    """
    if settings.PRODUCTION:
        raise CommandError(
            "load_scale_data makes users with published passwords; it refuses to "
            "run with production settings."
        )
    if tasks < 1 or tenants < 1:
        raise CommandError("--tasks and --tenants must be at least 1.")
    have_tasks, have_events = _counts()
    if not append and (have_tasks >= tasks or have_events >= events):
        raise CommandError(
            f"the database already holds {have_tasks:,} tasks and {have_events:,} "
            f"events (asked for {tasks:,} and {events:,}); nothing loaded. Pass "
            "--append to add that many more."
        )
    set_up, weights = tenants_set_up(count=tenants, report=report)
    # Row-level security: the chunks write the tenants just set up, on this thread
    # and on the writers' (whose context starts empty).
    in_scope = [t.id for t in set_up]

    def commit_in_scope(chunk: Chunk) -> None:
        with scope.tenant_scope(in_scope):
            commit(chunk)

    have_tasks, have_events = _counts()  # the set-up wrote events of its own
    new_tasks = tasks if append else tasks - have_tasks
    new_events = events if append else events - have_events
    if not (
        MIN_EVENTS_PER_TASK * new_tasks <= new_events <= MAX_EVENTS_PER_TASK * new_tasks
    ):
        raise CommandError(
            f"{new_events:,} events for {new_tasks:,} tasks: each task gets "
            f"{MIN_EVENTS_PER_TASK}-{MAX_EVENTS_PER_TASK} events."
        )
    # Published events are about 70 % of all; keep about ``outbox`` of them.
    share = 1.0 if outbox is None else min(1.0, outbox / (0.7 * new_events))
    report(
        f"loading {new_tasks:,} tasks and {new_events:,} events over {tenants} "
        f"tenants (seed {seed}, chunks of {chunk_tasks:,} tasks)"
    )
    # Reproducible test data, not secrets: the seed makes the same data set again
    # in an empty database; a top-up or an append draws fresh ids.
    rng = random.Random(f"{seed}:{have_tasks}")  # noqa: S311
    ids = Ids(rng)
    now = dt.datetime.now(dt.UTC)
    states = [name for name, _ in STATE_MIX]
    state_weights = [weight for _, weight in STATE_MIX]
    summary = LoadSummary()
    bar = Progress(total=new_events, unit="events", write=progress, tty=progress_tty)
    started = time.monotonic()

    def chunks() -> Iterator[Chunk]:
        remaining_events = new_events
        done = 0
        while done < new_tasks:
            chunk = Chunk()
            size = min(chunk_tasks, new_tasks - done)
            chosen_tenants = rng.choices(set_up, weights, k=size)
            chosen_states = rng.choices(states, state_weights, k=size)
            for offset in range(size):
                count = event_count(
                    rng,
                    remaining_events=remaining_events,
                    remaining_tasks=new_tasks - done - offset,
                )
                remaining_events -= count
                state = chosen_states[offset]
                task_story(
                    chunk=chunk,
                    rng=rng,
                    ids=ids,
                    tenant=chosen_tenants[offset],
                    index=have_tasks + done + offset,
                    state=state,
                    events=count,
                    created_at=_created_at(
                        rng, state=state, slot=done + offset, slots=new_tasks, now=now
                    ),
                    outbox_share=share,
                )
                chunk.events += count
            done += size
            yield chunk

    counted = threading.Lock()

    def commit(chunk: Chunk) -> None:
        with transaction.atomic():
            _copy(chunk)
        with counted:
            summary.tasks += len(chunk.rows["tasks_task"])
            summary.events += chunk.events
            summary.outbox += len(chunk.rows["audit_outbox"])
            summary.operations += len(chunk.rows["tasks_operation"])
            summary.escalations += len(chunk.rows["tasks_escalation"])
            summary.credentials += len(chunk.rows["tasks_credential"])
            bar.advance(chunk.events, final=summary.tasks >= new_tasks)

    next_analyze = 1

    def analyze_when_grown() -> None:
        # After the first chunk and whenever the load has doubled since.
        nonlocal next_analyze
        if summary.tasks >= next_analyze:
            _analyze()
            next_analyze = 2 * summary.tasks

    if writers < 1:
        for chunk in chunks():
            commit_in_scope(chunk)
            analyze_when_grown()
    else:
        # Build chunks here while ``writers`` threads COPY earlier ones, each on
        # its own connection and in its own transactions: the server's work
        # (indexes, foreign keys) is most of the cost, and a second backend uses
        # the second core.
        with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="copy") as pool:
            in_flight: deque[Future[None]] = deque()
            try:
                for chunk in chunks():
                    if len(in_flight) >= writers:
                        in_flight.popleft().result()
                    analyze_when_grown()
                    in_flight.append(pool.submit(commit_in_scope, chunk))
                while in_flight:
                    in_flight.popleft().result()
            finally:
                for running in in_flight:
                    running.cancel()
                # One close per thread, each in the thread that owns the
                # connection (the barrier keeps a thread from taking two).
                barrier = threading.Barrier(writers)

                def close_own() -> None:
                    barrier.wait(timeout=120)
                    connection.close()

                closing = [pool.submit(close_own) for _ in range(writers)]
                for closed in closing:
                    closed.result()
    summary.seconds = time.monotonic() - started
    _analyze()
    return summary


def _analyze() -> None:
    """Fresh statistics for the loaded tables.

    Not only for the pages afterwards: every foreign-key check is a cached plan,
    and planned against a table the statistics call empty it is a sequential scan,
    which makes each COPY slower the more rows are in (with autovacuum off, nothing
    else analyses them). ANALYZE invalidates those plans.
    """
    with connection.cursor() as cursor:
        for table, _ in TABLES:
            cursor.execute(f"ANALYZE {table}")
