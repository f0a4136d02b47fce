"""Celery jobs of the portal app (docs/style.md R10: thin, ids in, idempotent)."""

from __future__ import annotations

from celery import Celery, shared_task
from django.conf import settings
from django.utils.module_loading import import_string

from . import idempotency


def celery_app() -> Celery:
    """The configured Celery app (not celery's default one), handed over by the
    settings: ``PORTAL_CELERY_APP`` names it as ``WSGI_APPLICATION`` names the WSGI
    one, so no app below the wiring imports ``config`` (tests/unit/test_layering.py)."""
    app: Celery = import_string(settings.PORTAL_CELERY_APP)
    return app


@shared_task(acks_late=True, ignore_result=True)
def purge_idempotent_requests_job() -> int:
    """Delete Idempotency-Key records past their window; safe to run anywhere, often."""
    return idempotency.idempotent_requests_purge_expired()
