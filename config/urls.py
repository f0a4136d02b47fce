"""URLs: the API under /api/v1/ (agents and staff), its schema and docs, the admin."""

from __future__ import annotations

from csp.decorators import csp_update
from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.generic import RedirectView
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)

from audit.api import AuditPublicKeyApi
from config import health
from config.api_root import ApiRootApi
from config.metrics_views import metrics_view
from console.invitation_page import invitation_view
from limits import api as limits_api
from tasks.api import agent as agent_api
from tasks.api import evidence as evidence_api
from tasks.api import staff as staff_api

READ_ONLY = {"http_method_names": ["get", "head"]}

api_v1 = [
    path("tasks", agent_api.TaskCollectionApi.as_view()),
    path("tasks/claim-next", agent_api.TaskClaimNextApi.as_view()),
    path("tasks/<uuid:task_id>", agent_api.TaskDetailApi.as_view()),
    path("tasks/<uuid:task_id>/lease", agent_api.TaskLeaseAcquireApi.as_view()),
    path("tasks/<uuid:task_id>/lease/renew", agent_api.TaskLeaseRenewApi.as_view()),
    path("tasks/<uuid:task_id>/lease/release", agent_api.TaskLeaseReleaseApi.as_view()),
    path("tasks/<uuid:task_id>/transitions", agent_api.TaskTransitionApi.as_view()),
    path("tasks/<uuid:task_id>/operations", agent_api.OperationReserveApi.as_view()),
    path("tasks/<uuid:task_id>/events", agent_api.TaskEventsApi.as_view()),
    path("tasks/<uuid:task_id>/evidence", evidence_api.TaskEvidenceApi.as_view()),
    path("operations/<uuid:operation_id>", agent_api.OperationDetailApi.as_view()),
    path("operations/<uuid:operation_id>/start", agent_api.OperationStartApi.as_view()),
    path(
        "operations/<uuid:operation_id>/outcome",
        agent_api.OperationOutcomeApi.as_view(),
    ),
    path(
        "operations/<uuid:operation_id>/execute",
        agent_api.OperationExecuteApi.as_view(),
    ),
    path("actions", agent_api.ActionTakeApi.as_view()),
    path("contracts", agent_api.ContractCollectionApi.as_view()),
    path(
        "contracts/<slug:key>/versions/<int:version>",
        agent_api.ContractDetailApi.as_view(),
    ),
    path(
        "tenants/<slug:tenant_slug>/contracts",
        staff_api.TenantContractCreateApi.as_view(),
    ),
    path(
        "tenants/<slug:tenant_slug>/contracts/<slug:key>/versions/<int:version>/publish",
        staff_api.TenantContractPublishApi.as_view(),
    ),
    path(
        "tenants/<slug:tenant_slug>/contracts/<slug:key>/versions/<int:version>/retire",
        staff_api.TenantContractRetireApi.as_view(),
    ),
    path("tenants/<slug:tenant_slug>/freeze", limits_api.TenantFreezeApi.as_view()),
    path("tenants/<slug:tenant_slug>/unfreeze", limits_api.TenantUnfreezeApi.as_view()),
    path(
        "tenants/<slug:tenant_slug>/agents/<uuid:agent_id>/freeze",
        limits_api.AgentFreezeApi.as_view(),
    ),
    path(
        "tenants/<slug:tenant_slug>/agents/<uuid:agent_id>/unfreeze",
        limits_api.AgentUnfreezeApi.as_view(),
    ),
    path("takeover/queue", staff_api.TakeoverQueueApi.as_view()),
    path("takeover/tasks/<uuid:task_id>/claim", staff_api.TakeoverClaimApi.as_view()),
    path(
        "takeover/tasks/<uuid:task_id>/release", staff_api.TakeoverReleaseApi.as_view()
    ),
    path(
        "takeover/tasks/<uuid:task_id>/resolve", staff_api.TakeoverResolveApi.as_view()
    ),
    path("takeover/tasks/<uuid:task_id>/edit", staff_api.TakeoverEditApi.as_view()),
    path("approvals", staff_api.ApprovalListApi.as_view()),
    path(
        "approvals/<uuid:approval_id>/approve",
        staff_api.ApprovalApproveApi.as_view(),
    ),
    path("approvals/<uuid:approval_id>/reject", staff_api.ApprovalRejectApi.as_view()),
    path(
        "object-versions/<str:object_type>/<str:object_id>",
        agent_api.ObjectVersionApi.as_view(),
    ),
]


def favicon(request: HttpRequest) -> HttpResponse:
    """Every browser asks for /favicon.ico: nothing to show, said once a day, so a
    quiet ``up`` prints no 'Not Found' warning per visitor."""
    return HttpResponse(status=204, headers={"Cache-Control": "max-age=86400"})


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    # The front door: people land in the admin, agents at the API root.
    path("", RedirectView.as_view(url="/admin/", permanent=False), name="home"),
    path("api/v1/", ApiRootApi.as_view(), name="api-root"),
    path("api/v1/audit/public-key", AuditPublicKeyApi.as_view(), name="audit-key"),
    path("admin/", admin.site.urls),
    # An invitation's e-mailed link (console/invitation_page.py): before a tenant.
    path("invite/<str:token>", invitation_view, name="invitation"),
    # Operations (docs/observability.md): probes without authentication, and the
    # Prometheus exposition behind PORTAL_METRICS_TOKEN.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    # Read-only pages: OPTIONS on the HTML ones had DRF render its metadata
    # through a template-less HTML renderer (a 500).
    path("api/schema/", SpectacularAPIView.as_view(**READ_ONLY), name="schema"),
    # The split view serves Swagger UI's start script as a second request
    # (?script): the Content-Security-Policy runs no inline script (portal/csp.py).
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", **READ_ONLY),
        name="docs",
    ),
    path(
        "api/redoc/",
        csp_update(settings.PORTAL_CSP_REDOC)(
            SpectacularRedocView.as_view(url_name="schema", **READ_ONLY)
        ),
        name="redoc",
    ),
    *[path(f"api/v1/{p.pattern}", p.callback) for p in api_v1],
]
