"""The Celery app. Jobs live in each app's ``jobs.py`` (STYLE.md R10)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task
from celery.signals import beat_init, setup_logging, worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")


class ScopedTask(Task):
    """Each job starts with no tenant scope and leaves none (portal/scope.py)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from portal import scope

        with scope.unit_of_work():
            return super().__call__(*args, **kwargs)


app = Celery("portal", task_cls=ScopedTask)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(related_name="jobs")


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
