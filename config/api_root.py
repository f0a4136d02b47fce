"""The front door of the agent API: ``GET /api/v1/`` lists what is there.

Anonymous on purpose: it names resources and where their documentation lives,
nothing of any tenant. It is not in the OpenAPI document, which describes the
operations an agent calls with its key.
"""

from __future__ import annotations

from typing import Final

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

# (name, path, what it is): the main resources, as an agent meets them.
RESOURCES: Final = (
    ("tasks", "/api/v1/tasks", "Register a task (POST); read one at tasks/{id}."),
    ("claim_next", "/api/v1/tasks/claim-next", "Lease the next pending task."),
    (
        "operations",
        "/api/v1/tasks/{task_id}/operations",
        "Reserve a side effect under an idempotency key; then operations/{id}.",
    ),
    ("events", "/api/v1/tasks/{task_id}/events", "A task's redacted history."),
    ("contracts", "/api/v1/contracts", "The published action contracts."),
    (
        "takeover_queue",
        "/api/v1/takeover/queue",
        "Tasks waiting for a person (session login, support role).",
    ),
    (
        "object_versions",
        "/api/v1/object-versions/{object_type}/{object_id}",
        "The version of a business object an agent read.",
    ),
    (
        "audit_public_key",
        "/api/v1/audit/public-key",
        "The Ed25519 key that verifies audit checkpoints (anonymous).",
    ),
)


@extend_schema(exclude=True)
class ApiRootApi(APIView):
    authentication_classes = []
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        def link(path: str) -> str:
            return request.build_absolute_uri(path)

        return Response(
            {
                "name": "Agent governance portal API",
                "version": "v1",
                "authentication": "Authorization: Bearer <agent key>",
                "resources": {
                    name: {"href": link(path), "description": description}
                    for name, path, description in RESOURCES
                },
                "schema": link("/api/schema/"),
                "docs": link("/api/docs/"),
                "redoc": link("/api/redoc/"),
                "admin": link("/admin/"),
            }
        )
