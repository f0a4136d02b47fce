"""Agent endpoint for a task's history: redacted events, cursor-paginated."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api import AgentApi, problem_responses
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
    """Oldest first by default; ``?order=newest`` reverses (ids are time-ordered)."""

    ordering = "id"
    page_size = 100
    max_page_size = 500
    page_size_query_param = "page_size"

    def get_ordering(self, request: Request, queryset: Any, view: Any) -> tuple[str]:
        return ("-id",) if request.query_params.get("order") == "newest" else ("id",)


class TaskEventsApi(AgentApi):
    pagination_class = EventPagination  # also tells the schema the page shape

    @extend_schema_serializer(component_name="EventListFilter")
    class FilterSerializer(serializers.Serializer):
        order = serializers.ChoiceField(choices=["oldest", "newest"], default="oldest")

    @extend_schema(
        operation_id="tasks_events",
        parameters=[FilterSerializer],
        responses={
            200: EventOutputSerializer(many=True),
            **problem_responses(404),
        },
        description="The task's events, oldest (default) or newest first.",
    )
    def get(self, request: Request, task_id: Any) -> Response:
        self.validated(self.FilterSerializer, request.query_params)
        task = task_selectors.task_get(tenant=self.tenant, task_id=task_id)
        events = selectors.event_list(tenant=self.tenant, task_id=task.pk)
        paginator = self.pagination_class()
        page: list[Event] = (
            paginator.paginate_queryset(events, request, view=self) or []
        )
        return paginator.get_paginated_response(
            EventOutputSerializer(page, many=True).data
        )
