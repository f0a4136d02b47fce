"""The Celery app. Jobs live in each app's ``jobs.py`` (docs/style.md R10)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task, signals
from celery.signals import beat_init, setup_logging, worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class ScopedTask(Task):
    """Each job starts with no tenant scope and leaves none (portal/scope.py), and
    its end is recorded as the job's last run (portal/jobruns.py)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import time

        from portal import jobruns, scope

        started = time.monotonic()
        error: BaseException | None = None
        try:
            with scope.unit_of_work():
                return super().__call__(*args, **kwargs)
        except BaseException as raised:
            error = raised
            raise
        finally:
            # The job's last run, for the workers page (console/workers.py).
            jobruns.job_run_record(
                name=self.name,
                started=started,
                error=error,
                worker=str(getattr(self.request, "hostname", None) or ""),
            )


app = Celery("portal", task_cls=ScopedTask)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(related_name="jobs")


# --- Job outcomes for /metrics (portal_celery_job_outcomes_total) ---------------------
# Celery's signals fire in the process that ran the job (a prefork child), which
# writes its counts to PROMETHEUS_MULTIPROC_DIR when the worker's environment sets it:
# the same folder as gunicorn's on that host, so its /metrics shows them
# (docs/observability.md, "Metrics").


def _job_name(sender: Any) -> str:
    return str(getattr(sender, "name", None) or "unknown")


def _count(outcome: str) -> Any:
    def receiver(sender: Any = None, **_: Any) -> None:
        from portal import metrics

        metrics.job_outcome_counted(job=_job_name(sender), outcome=outcome)

    return receiver


# Each signal's sender is the job (the task object). Celery holds receivers weakly
# by default: these are kept alive by the module's names.
_on_success = _count("success")
_on_failure = _count("failure")
_on_retry = _count("retry")
_on_revoked = _count("revoked")
signals.task_success.connect(_on_success)
signals.task_failure.connect(_on_failure)
signals.task_retry.connect(_on_retry)
signals.task_revoked.connect(_on_revoked)


@signals.worker_process_shutdown.connect
def _on_process_shutdown(pid: int | None = None, **_: Any) -> None:
    """A pool process ends: its live gauges leave the sums (counters stay)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


# The tracer provider, once per process that runs or sends jobs (portal/telemetry.py).
@worker_process_init.connect(weak=False)
def _telemetry_in_pool_process(**_: Any) -> None:
    from portal import telemetry

    telemetry.setup("portal-worker")


@worker_init.connect(weak=False)
def _telemetry_in_worker(sender: Any = None, **_: Any) -> None:
    # A prefork pool's processes set up their own (above); solo and thread pools
    # run jobs in this process.
    if "prefork" not in str(getattr(sender, "pool_cls", "")).lower():
        from portal import telemetry

        telemetry.setup("portal-worker")


@beat_init.connect(weak=False)
def _telemetry_in_beat(**_: Any) -> None:
    from portal import telemetry

    telemetry.setup("portal-beat")


def _django_logging(**_: Any) -> None:
    """The settings' LOGGING (applied by django.setup()) stays in charge."""
    import logging.config

    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


def _json_logs() -> bool:
    from django.conf import settings

    return bool(settings.PORTAL_LOG_FORMAT == "json")


# With JSON logs, Celery must not replace the root logger's handlers with its own
# text format: a connected ``setup_logging`` receiver tells it so.
if _json_logs():
    setup_logging.connect(_django_logging, weak=False)
