"""Agent endpoint for a task's history: redacted events, cursor-paginated."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api import AgentApi, ProblemSerializer
from portal.codes import ReasonCode
from tasks import selectors as task_selectors

from . import selectors
from .models import Event, EventCode


class EventOutputSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    code = serializers.ChoiceField(choices=EventCode.choices)
    task_id = serializers.UUIDField(allow_null=True)
    operation_id = serializers.UUIDField(allow_null=True)
    actor_type = serializers.CharField()
    actor_id = serializers.CharField()
    reason_code = serializers.ChoiceField(choices=ReasonCode.choices, allow_null=True)
    contract_key = serializers.CharField(allow_null=True)
    contract_version = serializers.IntegerField(allow_null=True)
    payload = serializers.JSONField(help_text="Redacted facts and references only.")
    trace_id = serializers.CharField()
    span_id = serializers.CharField()
    created_at = serializers.DateTimeField()


class EventPagination(CursorPagination):
    page_size = 100
    max_page_size = 500
    page_size_query_param = "page_size"

    def __init__(self, *, newest_first: bool) -> None:
        self.ordering = "-id" if newest_first else "id"


class TaskEventsApi(AgentApi):
    class FilterSerializer(serializers.Serializer):
        order = serializers.ChoiceField(choices=["oldest", "newest"], default="oldest")

    @extend_schema(
        operation_id="tasks_events",
        parameters=[FilterSerializer],
        responses={
            200: EventOutputSerializer(many=True),
            **{status: ProblemSerializer for status in (400, 401, 404, 429)},
        },
        description="The task's events, oldest (default) or newest first.",
    )
    def get(self, request: Request, task_id: Any) -> Response:
        filters = self.validated(self.FilterSerializer, request.query_params)
        task = task_selectors.task_get(tenant=self.tenant, task_id=task_id)
        events = selectors.event_list(tenant=self.tenant, task_id=task.pk)
        paginator = EventPagination(newest_first=filters["order"] == "newest")
        page: list[Event] = (
            paginator.paginate_queryset(events, request, view=self) or []
        )
        return paginator.get_paginated_response(
            EventOutputSerializer(page, many=True).data
        )
