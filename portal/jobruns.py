"""The last run of each Celery job, recorded by the worker that ran it.

``ScopedTask.__call__`` (config/celery.py) calls :func:`job_run_record` when a job
returns or raises, on the job's own database connection (Celery's Django fixup
closes it before and after each job, so a write after the job would open another).
One upsert of ``portal_jobrun``. A job that runs many times a second (the outbox
relay under load) is recorded at most once a second per process and job; a failure
is always recorded. Recording never fails the job: a database error is logged.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Final

from django.db import DatabaseError, connection, transaction

from .models import JobOutcome

log = logging.getLogger(__name__)

# Successes of one job are written at most this often per process.
SUCCESS_EVERY_S: Final = 1.0
_last_written: dict[str, float] = {}
_HOST: Final = socket.gethostname()

_UPSERT = """
INSERT INTO portal_jobrun (name, finished_at, duration_ms, outcome, worker, error)
VALUES (%s, app_now(), %s, %s, %s, %s)
ON CONFLICT (name) DO UPDATE SET finished_at = EXCLUDED.finished_at,
    duration_ms = EXCLUDED.duration_ms, outcome = EXCLUDED.outcome,
    worker = EXCLUDED.worker, error = EXCLUDED.error
"""


def job_run_record(
    *, name: str, started: float, error: BaseException | None, worker: str = ""
) -> bool:
    """Record that job ``name`` (begun at ``time.monotonic()`` ``started``) ended,
    with ``error`` if it raised. Returns whether a row was written."""
    now = time.monotonic()
    if error is None and now - _last_written.get(name, float("-inf")) < SUCCESS_EVERY_S:
        return False
    if connection.in_atomic_block and connection.needs_rollback:
        return False  # a caller's broken transaction (a test calling a job inline)
    outcome = JobOutcome.SUCCESS if error is None else JobOutcome.FAILURE
    text = "" if error is None else f"{type(error).__name__}: {error}"[:200]
    params: list[str | int] = [
        name[:200],
        max(0, round((now - started) * 1000)),
        outcome,
        (worker or _HOST)[:200],
        text,
    ]
    try:
        if connection.in_atomic_block:
            # Inside a caller's transaction (a job called inline): a savepoint, so
            # a refused write leaves that transaction usable.
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(_UPSERT, params)
        else:
            with connection.cursor() as cursor:
                cursor.execute(_UPSERT, params)
    except DatabaseError as failure:
        log.warning("job run of %s not recorded: %s", name, failure)
        return False
    _last_written[name] = now
    return True
