from __future__ import annotations

from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Tenancy and identity"

    def ready(self) -> None:
        # Bind @shared_task jobs to the project's Celery app in every process.
        from . import celery  # noqa: F401
