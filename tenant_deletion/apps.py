from __future__ import annotations

from django.apps import AppConfig


class TenantDeletionConfig(AppConfig):
    """Tenant deletion: above every app; its migrations hold the operator's purge."""

    name = "tenant_deletion"
    verbose_name = "Tenant deletion"
