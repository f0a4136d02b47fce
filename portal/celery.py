"""The Celery app. Jobs live in each app's ``jobs.py`` (STYLE.md R10)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task

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
