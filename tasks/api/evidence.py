"""``GET /api/v1/tasks/{id}/evidence``: a task's evidence bundle (tasks/evidence.py).

For the agents of the task's tenant (Bearer key) and for people holding
``export_trail`` there (the admin's session). Another tenant's task is 404 for both;
a person who reads the tenant without the export permission gets 403.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request

from portal.actors import Actor
from portal.api import (
    AgentKeyAuthentication,
    AgentRateThrottle,
    PortalApi,
    problem_responses,
)
from portal.models import Agent

from .. import evidence, selectors

# The bundle's shape, for the schema only: the view returns the builder's JSON as it
# is, so nothing is re-serialised between the hashing and the wire.


class _ActorSerializer(serializers.Serializer):
    actor_type = serializers.CharField()
    actor_id = serializers.CharField()


class EvidenceEventSerializer(serializers.Serializer):
    seq = serializers.IntegerField(
        allow_null=True, help_text="Place in the chain (1, 2, …)."
    )
    prev_hash = serializers.CharField(
        allow_null=True, help_text="The previous event's hash; null for the first."
    )
    hash = serializers.CharField(allow_null=True)
    content = serializers.DictField(
        help_text="The event exactly as hashed (audit/chain.py event_content)."
    )


class EvidenceChainSerializer(serializers.Serializer):
    kind = serializers.CharField()
    tenant_id = serializers.UUIDField()
    task_id = serializers.UUIDField()
    hash = serializers.CharField()
    canonicalization = serializers.CharField()
    link = serializers.CharField()
    checkpoint_signature = serializers.CharField()
    length = serializers.IntegerField()
    head_hash = serializers.CharField(allow_null=True)
    events = EvidenceEventSerializer(many=True)


class EvidenceCheckpointSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    algorithm = serializers.CharField()
    v = serializers.IntegerField()
    tenant_id = serializers.UUIDField()
    task_id = serializers.UUIDField(allow_null=True)
    head_seq = serializers.IntegerField()
    head_event_id = serializers.UUIDField()
    head_hash = serializers.CharField()
    event_count = serializers.IntegerField()
    signed_at = serializers.CharField()
    key_id = serializers.CharField()
    signature = serializers.CharField(help_text="Ed25519, hex.")


class EvidenceCoverageSerializer(serializers.Serializer):
    complete = serializers.BooleanField(
        help_text="Whether the checkpoint signs every event of the chain."
    )
    events = serializers.IntegerField()
    signed_events = serializers.IntegerField()
    unsigned_events = serializers.IntegerField()
    note = serializers.CharField()


class EvidenceTenantSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    slug = serializers.CharField()


class EvidenceBundleSerializer(serializers.Serializer):
    format = serializers.CharField()
    version = serializers.IntegerField()
    exported_at = serializers.CharField()
    exported_by = _ActorSerializer()
    tenant = EvidenceTenantSerializer()
    task = serializers.DictField()
    operations = serializers.ListField(child=serializers.DictField())
    receipts = serializers.ListField(child=serializers.DictField())
    escalations = serializers.ListField(child=serializers.DictField())
    takeover_decisions = serializers.ListField(child=serializers.DictField())
    chain = EvidenceChainSerializer()
    checkpoint = EvidenceCheckpointSerializer(allow_null=True)
    coverage = EvidenceCoverageSerializer()


class TaskEvidenceApi(PortalApi):
    """Agents by key, people by session: one bundle, the same for both."""

    authentication_classes = [AgentKeyAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_classes = [AgentRateThrottle]

    @extend_schema(
        operation_id="tasks_evidence",
        responses={
            200: EvidenceBundleSerializer,
            **problem_responses(403, 404, 503),
        },
        description="The task's evidence bundle: the task, its operations, receipts, "
        "escalations and takeover decisions, every event of its hash chain with the "
        "content as hashed, and the signed checkpoint that covers the chain's head "
        "(signed now if the newest events were not signed yet). Check it offline "
        "with tools/verify_bundle.py and the key of GET /api/v1/audit/public-key. "
        "For the task's agents, and for people with the export permission in its "
        "tenant (403 without it); another tenant's task is 404. Each export is "
        "recorded as an audit.exported event.",
    )
    def get(self, request: Request, task_id: Any) -> HttpResponse:
        user = request.user
        if isinstance(user, Agent):
            task = selectors.task_get(tenant=user.tenant, task_id=task_id)
            actor = Actor.of_agent(user)
        else:
            task = evidence.task_get_for_exporter(user=user, task_id=task_id)
            actor = Actor.of_user(user)
        bundle = evidence.task_evidence_bundle(task=task, by=actor)
        response = HttpResponse(
            evidence.evidence_json(bundle), content_type="application/json"
        )
        response["Cache-Control"] = "no-store"
        return response
