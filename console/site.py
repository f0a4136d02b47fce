"""The portal's admin site: Django's, with a dashboard on the front page, the
workers page (``/admin/workers/``) and the operator's new-tenant page
(``/admin/tenants/new/``, console/tenant_page.py).

``console.apps.PortalAdminConfig`` makes this the default site, so ``admin.site``
(where console/admin registers every page) is an instance of it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path

from portal.models import Tenant, TenantPerm

from . import dashboard, tenant_page, workers

# How often the live part of the dashboard and the workers page is fetched again.
DASHBOARD_REFRESH_S = 30
WORKERS_REFRESH_S = 10


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
        return super().index(
            request,
            {
                "dashboard": figures,
                "refresh_s": DASHBOARD_REFRESH_S,
                "workers_page": request.user.is_superuser
                or bool(tenant_ids(request, TenantPerm.MANAGE_OUTBOX)),
                "tenant_new_page": request.user.is_superuser,
                **(extra_context or {}),
            },
        )

    def get_urls(self) -> list[URLResolver | URLPattern]:
        return [
            path("workers/", self.admin_view(self.workers_view), name="workers"),
            path(
                "tenants/new/",
                self.admin_view(tenant_page.tenant_new_view),
                name="tenant_new",
            ),
            *super().get_urls(),
        ]

    def workers_view(self, request: HttpRequest) -> HttpResponse:
        """Workers, the jobs' queue and beat for an operator (a superuser); the
        outbox of their own tenants for a tenant administrator; 403 for others."""
        from portal.jobs import celery_app

        from .admin.base import tenant_ids

        operator = bool(request.user.is_superuser)
        outbox_ids = tenant_ids(request, TenantPerm.MANAGE_OUTBOX)
        if not operator and not outbox_ids:
            raise PermissionDenied
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])

        def outbox() -> list[dashboard.OutboxHealth]:
            tenants = list(Tenant.objects.filter(pk__in=outbox_ids).order_by("slug"))
            return dashboard.outbox_health(tenants=tenants)

        page = workers.workers_page_get(
            operator=operator, outbox=outbox, app=celery_app()
        )
        context = {
            **self.each_context(request),
            "title": "Workers and queues",
            "page": page,
            "refresh_s": WORKERS_REFRESH_S,
            "timeout_s": workers.BROKER_TIMEOUT_S,
        }
        return TemplateResponse(request, "admin/console/workers.html", context)
