"""The Django project: settings, URLs, the Celery app, tenancy and identity."""

from __future__ import annotations
