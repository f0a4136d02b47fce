from __future__ import annotations

from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing and notifications"
    default_auto_field = "django.db.models.BigAutoField"
