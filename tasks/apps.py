from __future__ import annotations

from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = "Tasks and operations"

    def ready(self) -> None:
        from . import exceptions  # noqa: F401  (registers constraint -> error names)
