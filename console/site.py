"""The portal's admin site: Django's, with a dashboard on the front page.

``console.apps.PortalAdminConfig`` makes this the default site, so ``admin.site``
(where console/admin registers every page) is an instance of it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse

from portal.models import TenantPerm

from . import dashboard


class PortalAdminSite(admin.AdminSite):
    def index(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        """Django's index (the app list) under the person's dashboard."""
        # Imported here: console.admin registers its pages on this site, so it
        # cannot be imported while this module is.
        from .admin.base import tenant_ids

        figures = dashboard.dashboard_get(
            view_tenant_ids=tenant_ids(request, TenantPerm.VIEW_TRAIL),
            outbox_tenant_ids=tenant_ids(request, TenantPerm.MANAGE_OUTBOX),
        )
        return super().index(request, {"dashboard": figures, **(extra_context or {})})
