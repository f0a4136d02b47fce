from __future__ import annotations

from django.apps import AppConfig


class WiringConfig(AppConfig):
    name = "config"
    verbose_name = "Wiring"

    def ready(self) -> None:
        # Bind @shared_task jobs to the project's Celery app in every process.
        from . import celery  # noqa: F401
