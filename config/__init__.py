"""The wiring above the apps: settings, URLs, WSGI, the Celery app, /metrics, health,
and the management commands that span apps. Nothing below imports it
(tests/unit/test_layering.py); it may import any app."""

from __future__ import annotations
