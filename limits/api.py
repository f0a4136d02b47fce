"""The kill switch over HTTP: the staff endpoints, and the record of frozen callers.

``portal.api.AgentKeyAuthentication`` refuses a frozen agent or tenant before any
view runs; portal's base modules write no events (docs/style.md R1), so the denial is
written here, where the answer is made, in a transaction of its own.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from portal import api as portal_api
from portal import selectors as portal_selectors
from portal.api import StaffApi, problem_responses
from portal.api_fields import OutputSerializer
from portal.exceptions import CallerFrozen
from portal.models import Tenant, TenantPerm

from . import services


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse:
    """``portal.api.problem_exception_handler``, after recording a frozen caller's
    refused request as a denial (once: a service's refusal is recorded there), and
    a revoked or expired key's use as ``agent_key.refused`` in its tenant."""
    if isinstance(exc, CallerFrozen) and not exc.recorded:
        request = context.get("request")
        services.denial_record(
            tenant_id=exc.tenant_id,
            agent_id=exc.context.get("agent_id"),
            error=exc,
            phase="api",
            method=getattr(request, "method", ""),
            path=getattr(request, "path", ""),
        )
        exc.recorded = True
    if isinstance(exc, portal_api.KnownKeyRefused) and exc.key and not exc.recorded:
        request = context.get("request")
        services.key_refusal_record(
            key=exc.key,
            status="revoked"
            if isinstance(exc, portal_api.ApiKeyRevoked)
            else "expired",
            address=getattr(request, "META", {}).get("REMOTE_ADDR", ""),
            method=getattr(request, "method", ""),
            path=getattr(request, "path", ""),
        )
        exc.recorded = True
    return portal_api.problem_exception_handler(exc, context)


# --- Staff endpoints: the kill switch (tenant administrators) ----------------------


class FrozenOutputSerializer(OutputSerializer):
    id = serializers.UUIDField()
    frozen = serializers.BooleanField()
    frozen_at = serializers.DateTimeField(allow_null=True)


class _FreezeApi(StaffApi):
    """Freeze or unfreeze; ``frozen`` comes from the URL."""

    frozen: bool = True

    def _tenant(self, request: Request, tenant_slug: str) -> Tenant:
        return portal_selectors.tenant_for_person(
            user=request.user, slug=tenant_slug, perm=TenantPerm.MANAGE_TENANT
        )


class AgentFreezeApi(_FreezeApi):
    @extend_schema(
        request=None,
        responses={200: FrozenOutputSerializer, **problem_responses(403, 404)},
        description="Freeze one agent (tenant administrators): from the commit on "
        "every call of it answers 403 AGENT_FROZEN; its live leases expire and the "
        "live credentials of its operations are revoked (docs/limits.md).",
    )
    def post(self, request: Request, tenant_slug: str, agent_id: uuid.UUID) -> Response:
        tenant = self._tenant(request, tenant_slug)
        agent = services.agent_freeze(
            tenant=tenant, agent_id=agent_id, frozen=self.frozen, by=request.user
        )
        return Response(
            FrozenOutputSerializer(
                {"id": agent.pk, "frozen": agent.frozen_at is not None,
                 "frozen_at": agent.frozen_at}
            ).data
        )  # fmt: skip


class AgentUnfreezeApi(AgentFreezeApi):
    frozen = False


class TenantFreezeApi(_FreezeApi):
    @extend_schema(
        request=None,
        responses={200: FrozenOutputSerializer, **problem_responses(403, 404)},
        description="Freeze a tenant (tenant administrators): every call of each of "
        "its agents answers 403 TENANT_FROZEN; every live lease expires and every "
        "live credential is revoked. People keep working (docs/limits.md).",
    )
    def post(self, request: Request, tenant_slug: str) -> Response:
        tenant = services.tenant_freeze(
            tenant=self._tenant(request, tenant_slug),
            frozen=self.frozen,
            by=request.user,
        )
        return Response(
            FrozenOutputSerializer(
                {"id": tenant.pk, "frozen": tenant.frozen_at is not None,
                 "frozen_at": tenant.frozen_at}
            ).data
        )  # fmt: skip


class TenantUnfreezeApi(TenantFreezeApi):
    frozen = False
