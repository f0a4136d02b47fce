"""URLs: the agent API under /api/v1/, its schema and docs, and the admin."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerView,
)

from tasks import api as task_api

handler404 = "portal.api.not_found_view"
handler500 = "portal.api.server_error_view"

api_v1 = [
    path("tasks", task_api.TaskCollectionApi.as_view()),
    path("tasks/claim-next", task_api.TaskClaimNextApi.as_view()),
    path("tasks/<uuid:task_id>", task_api.TaskDetailApi.as_view()),
    path("tasks/<uuid:task_id>/lease", task_api.TaskLeaseAcquireApi.as_view()),
    path("tasks/<uuid:task_id>/lease/renew", task_api.TaskLeaseRenewApi.as_view()),
    path("tasks/<uuid:task_id>/lease/release", task_api.TaskLeaseReleaseApi.as_view()),
    path("tasks/<uuid:task_id>/transitions", task_api.TaskTransitionApi.as_view()),
    path("tasks/<uuid:task_id>/operations", task_api.OperationReserveApi.as_view()),
    path("tasks/<uuid:task_id>/events", task_api.TaskEventsApi.as_view()),
    path("operations/<uuid:operation_id>", task_api.OperationDetailApi.as_view()),
    path("operations/<uuid:operation_id>/start", task_api.OperationStartApi.as_view()),
    path(
        "operations/<uuid:operation_id>/outcome", task_api.OperationOutcomeApi.as_view()
    ),
    path(
        "operations/<uuid:operation_id>/execute", task_api.OperationExecuteApi.as_view()
    ),
    path("contracts", task_api.ContractCollectionApi.as_view()),
    path(
        "contracts/<slug:key>/versions/<int:version>",
        task_api.ContractDetailApi.as_view(),
    ),
    path(
        "tenants/<slug:tenant_slug>/contracts",
        task_api.TenantContractCreateApi.as_view(),
    ),
    path(
        "tenants/<slug:tenant_slug>/contracts/<slug:key>/versions/<int:version>/publish",
        task_api.TenantContractPublishApi.as_view(),
    ),
    path(
        "tenants/<slug:tenant_slug>/contracts/<slug:key>/versions/<int:version>/retire",
        task_api.TenantContractRetireApi.as_view(),
    ),
    path("takeover/queue", task_api.TakeoverQueueApi.as_view()),
    path("takeover/tasks/<uuid:task_id>/claim", task_api.TakeoverClaimApi.as_view()),
    path(
        "takeover/tasks/<uuid:task_id>/release", task_api.TakeoverReleaseApi.as_view()
    ),
    path(
        "takeover/tasks/<uuid:task_id>/resolve", task_api.TakeoverResolveApi.as_view()
    ),
    path(
        "object-versions/<str:object_type>/<str:object_id>",
        task_api.ObjectVersionApi.as_view(),
    ),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    *[path(f"api/v1/{p.pattern}", p.callback) for p in api_v1],
]
