"""Agent endpoints: tasks, leases, transitions, events, operations, object versions.

Authenticated by the agent's Bearer key; the tenant always comes from the key. One
view per operation; each validates, calls one service and serialises
(docs/style.md R11).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_serializer,
)
from rest_framework import serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from audit import selectors as audit_selectors
from audit.models import Event
from portal import idempotency
from portal.api import LEASE_TOKEN_HEADER, AgentApi, problem, problem_responses
from portal.api_input import (
    CanonicalJsonValueField,
    JsonObjectField,
    QueryInput,
    StrictInput,
)
from portal.codes import ReasonCode

from .. import actions, dispatch, gateway, selectors, services
from ..exceptions import ActionInFlight, gateway_refusal
from ..models import ObjectVersion, OperationState, TaskState
from .serializers import (
    ActionOutputSerializer,
    ContractOutputSerializer,
    EventOutputSerializer,
    ExecutionOutputSerializer,
    FieldReadSerializer,
    FieldValueSerializer,
    LeaseInputSerializer,
    ObjectVersionOutputSerializer,
    OperationOutputSerializer,
    RenewInputSerializer,
    TaskOutputSerializer,
)

IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "pattern": "^[!-~]{1,255}$"},
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "Makes the POST safe to retry: the same key and body replay the first answer "
        "(header Idempotent-Replayed: true); another body answers 422; a duplicate "
        "while the first runs answers 409. Scoped per agent, kept 24 h. 1-255 "
        "visible ASCII characters."
    ),
)
TRACEPARENT_HEADER = OpenApiParameter(
    "traceparent",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="W3C Trace Context: its trace id is stored on what the request makes; "
    "an invalid value starts a new trace.",
)
LEASE_HEADER = OpenApiParameter(
    LEASE_TOKEN_HEADER,
    {"type": "integer", "minimum": 0, "maximum": 999_999_999_999_999_999},
    OpenApiParameter.HEADER,
    required=True,
    description="The fencing token of your lease on the task.",
)
POST_HEADERS = [IDEMPOTENCY_HEADER, TRACEPARENT_HEADER]
PREFER_HEADER = OpenApiParameter(
    "Prefer",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="respond-async: run the checks now (their verdict commits), answer "
    "202 with outcome 'queued', and let a worker make the call; poll the operation.",
)


# --- Tasks ----------------------------------------------------------------------------


class TaskListPagination(CursorPagination):
    ordering = "id"  # UUIDv7: creation order, unique, stable under inserts
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"


class TaskCollectionApi(AgentApi):
    pagination_class = TaskListPagination  # also tells the schema the page shape

    @extend_schema_serializer(component_name="TaskRegisterInput")
    class InputSerializer(StrictInput):
        client_task_id = serializers.CharField(max_length=200)
        workflow_key = serializers.CharField(max_length=100)
        workflow_version = serializers.CharField(max_length=50)
        object_type = serializers.CharField(max_length=100)
        object_id = serializers.CharField(max_length=200)
        object_version = serializers.CharField(max_length=100)
        contract_key = serializers.CharField(max_length=100, required=False)
        contract_version = serializers.IntegerField(
            min_value=1,
            max_value=2**31 - 1,
            required=False,
            help_text="Omit to pin the newest published version.",
        )

    @extend_schema_serializer(component_name="TaskListFilter")
    class FilterSerializer(QueryInput):
        state = serializers.ChoiceField(choices=TaskState.choices, required=False)
        object_type = serializers.CharField(max_length=100, required=False)
        object_id = serializers.CharField(max_length=200, required=False)
        trace_id = serializers.CharField(max_length=32, required=False)
        updated_since = serializers.DateTimeField(required=False)
        cursor = serializers.CharField(
            required=False, help_text="From the `next` or `previous` link."
        )
        page_size = serializers.IntegerField(
            min_value=1, max_value=TaskListPagination.max_page_size, required=False
        )

    @extend_schema(
        operation_id="tasks_register",
        request=InputSerializer,
        responses={
            201: TaskOutputSerializer,
            200: TaskOutputSerializer,
            **problem_responses(404, 409, 422, post=True),
        },
        parameters=POST_HEADERS,
        examples=[
            OpenApiExample(
                "Customer issue",
                request_only=True,
                value={
                    "client_task_id": "issue-1042",
                    "workflow_key": "customer-issue",
                    "workflow_version": "1",
                    "object_type": "customer_issue",
                    "object_id": "1042",
                    "object_version": "7",
                    "contract_key": "customer-issue-ticket",
                },
            )
        ],
        description="Register a task; idempotent on client_task_id (200 if it exists).",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        registration = services.task_register(
            tenant=self.tenant, actor=self.actor, trace=self.trace, **data
        )
        return Response(
            TaskOutputSerializer(registration.task).data,
            status=201 if registration.created else 200,
        )

    @extend_schema(
        operation_id="tasks_list",
        parameters=[FilterSerializer],
        responses={200: TaskOutputSerializer(many=True), **problem_responses(404)},
        description="The tenant's tasks, oldest first, cursor-paginated (404 for a "
        "cursor this portal did not write).",
    )
    def get(self, request: Request) -> Response:
        filters = self.validated(self.FilterSerializer, request.query_params)
        # Validated above; the paginator reads them from the query string itself.
        filters.pop("cursor", None)
        filters.pop("page_size", None)
        tasks = selectors.task_list(tenant=self.tenant, **filters)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(tasks, request, view=self)
        return paginator.get_paginated_response(
            TaskOutputSerializer(page, many=True).data
        )


class TaskDetailApi(AgentApi):
    @extend_schema(
        operation_id="tasks_get",
        responses={200: TaskOutputSerializer, **problem_responses(404)},
    )
    def get(self, request: Request, task_id: Any) -> Response:
        task = selectors.task_get(tenant=self.tenant, task_id=task_id)
        return Response(TaskOutputSerializer(task).data)


class TaskClaimNextApi(AgentApi):
    @extend_schema_serializer(component_name="TaskClaimNextInput")
    class InputSerializer(StrictInput):
        owner = serializers.CharField(max_length=200, help_text="Your worker's name.")
        ttl_s = serializers.IntegerField(min_value=1, max_value=3600, required=False)

    @extend_schema(
        operation_id="tasks_claim_next",
        request=InputSerializer,
        responses={
            200: TaskOutputSerializer,
            204: None,
            **problem_responses(post=True),
        },
        parameters=POST_HEADERS,
        description="Claim the oldest pending task (it becomes running, leased to "
        "you). "
        "204 when nothing is pending.",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        task = services.task_claim_next(
            tenant=self.tenant, actor=self.actor, trace=self.trace, **data
        )
        if task is None:
            return Response(status=204)
        return Response(TaskOutputSerializer(task).data)


class TaskLeaseAcquireApi(AgentApi):
    @extend_schema(
        operation_id="tasks_lease_acquire",
        request=LeaseInputSerializer,
        responses={200: TaskOutputSerializer, **problem_responses(404, 409, post=True)},
        parameters=POST_HEADERS,
        description="Take the task's lease (409 LEASE_HELD while another holds it).",
    )
    def post(self, request: Request, task_id: Any) -> Response:
        data = self.validated(LeaseInputSerializer, request.data)
        task = services.task_lease_acquire(
            tenant=self.tenant,
            task_id=task_id,
            actor=self.actor,
            trace=self.trace,
            **data,
        )
        return Response(TaskOutputSerializer(task).data)


class TaskLeaseRenewApi(AgentApi):
    @extend_schema(
        operation_id="tasks_lease_renew",
        request=RenewInputSerializer,
        responses={200: TaskOutputSerializer, **problem_responses(404, 409, post=True)},
        parameters=[LEASE_HEADER, *POST_HEADERS],
    )
    def post(self, request: Request, task_id: Any) -> Response:
        data = self.validated(RenewInputSerializer, request.data)
        task = services.task_lease_renew(
            tenant=self.tenant,
            task_id=task_id,
            lease_token=self.lease_token(request),
            **data,
        )
        return Response(TaskOutputSerializer(task).data)


class TaskLeaseReleaseApi(AgentApi):
    @extend_schema(
        operation_id="tasks_lease_release",
        request=None,
        responses={200: TaskOutputSerializer, **problem_responses(404, 409, post=True)},
        parameters=[LEASE_HEADER, *POST_HEADERS],
        description="Give the lease back; a running task returns to pending.",
    )
    def post(self, request: Request, task_id: Any) -> Response:
        task = services.task_lease_release(
            tenant=self.tenant,
            task_id=task_id,
            lease_token=self.lease_token(request),
            actor=self.actor,
            trace=self.trace,
        )
        return Response(TaskOutputSerializer(task).data)


class TaskTransitionApi(AgentApi):
    @extend_schema_serializer(component_name="TaskTransitionInput")
    class InputSerializer(StrictInput):
        to = serializers.ChoiceField(choices=TaskState.choices)
        expected_state_version = serializers.IntegerField(
            min_value=1, max_value=2**31 - 1
        )
        step = serializers.CharField(max_length=100, required=False)
        reason_code = serializers.ChoiceField(
            choices=ReasonCode.choices, required=False
        )
        wake_at = serializers.DateTimeField(required=False)
        payload = JsonObjectField(
            required=False, help_text="Facts for the event (redacted, bounded)."
        )

    # The schema's two shapes of the one input: wake_at only with to: waiting (the
    # service refuses it otherwise). oneOf, told apart by `to`.
    @extend_schema_serializer(component_name="TaskTransitionToWaiting")
    class ToWaitingSerializer(InputSerializer):
        to = serializers.ChoiceField(choices=[TaskState.WAITING])
        wake_at = serializers.DateTimeField(
            required=False, help_text="When a worker moves it back to pending."
        )

    @extend_schema_serializer(component_name="TaskTransitionToOther")
    class ToOtherSerializer(InputSerializer):
        to = serializers.ChoiceField(
            choices=[s for s in TaskState.values if s != TaskState.WAITING]
        )
        wake_at = None  # type: ignore[assignment]  # DRF drops it: only with waiting

    @extend_schema(
        operation_id="tasks_transition",
        request=PolymorphicProxySerializer(
            component_name="TaskTransitionInput",
            serializers=[ToWaitingSerializer, ToOtherSerializer],
            resource_type_field_name=None,
        ),
        responses={200: TaskOutputSerializer, **problem_responses(404, 409, post=True)},
        parameters=[LEASE_HEADER, *POST_HEADERS],
        description="Move the task under your lease. 409 STALE_STATE when "
        "expected_state_version is old (reload, never overwrite); 409 LEASE_EXPIRED "
        "when your token is fenced out.",
    )
    def post(self, request: Request, task_id: Any) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        task = services.task_transition(
            tenant=self.tenant,
            task_id=task_id,
            to=data["to"],
            expected_version=data["expected_state_version"],
            lease_token=self.lease_token(request),
            actor=self.actor,
            trace=self.trace,
            reason=data.get("reason_code"),
            step=data.get("step"),
            wake_at=data.get("wake_at"),
            data=data.get("payload"),
        )
        return Response(TaskOutputSerializer(task).data)


# --- Events ---------------------------------------------------------------------------


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
    class FilterSerializer(QueryInput):
        order = serializers.ChoiceField(choices=["oldest", "newest"], default="oldest")
        cursor = serializers.CharField(
            required=False, help_text="From the `next` or `previous` link."
        )
        page_size = serializers.IntegerField(
            min_value=1, max_value=EventPagination.max_page_size, required=False
        )

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
        task = selectors.task_get(tenant=self.tenant, task_id=task_id)
        events = audit_selectors.event_list(tenant=self.tenant, task_id=task.pk)
        paginator = self.pagination_class()
        page: list[Event] = (
            paginator.paginate_queryset(events, request, view=self) or []
        )
        return paginator.get_paginated_response(
            EventOutputSerializer(page, many=True).data
        )


# --- Operations -----------------------------------------------------------------------


class OperationReserveApi(AgentApi):
    @extend_schema_serializer(component_name="OperationReserveInput")
    class InputSerializer(StrictInput):
        idempotency_key = serializers.CharField(
            max_length=200, help_text="The business identity of the side effect."
        )
        action = serializers.CharField(max_length=100)
        target = serializers.CharField(max_length=200)
        input = CanonicalJsonValueField(
            allow_null=True, help_text="Hashed with RFC 8785 + SHA-256."
        )

    @extend_schema(
        operation_id="operations_reserve",
        request=InputSerializer,
        responses={
            201: OperationOutputSerializer,
            200: OperationOutputSerializer,
            **problem_responses(403, 404, 409, 422, post=True),
        },
        parameters=[LEASE_HEADER, *POST_HEADERS],
        description="Reserve a side effect before calling out. 201 new; 200 the same "
        "key and input again; 422 IDEMPOTENCY_KEY_REUSED for another input.",
    )
    def post(self, request: Request, task_id: Any) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        reservation = services.operation_reserve(
            tenant=self.tenant,
            task_id=task_id,
            lease_token=self.lease_token(request),
            idempotency_key=data["idempotency_key"],
            action=data["action"],
            target=data["target"],
            input=data["input"],
            actor=self.actor,
            trace=self.trace,
        )
        return Response(
            OperationOutputSerializer(reservation.operation).data,
            status=201 if reservation.created else 200,
        )


class OperationDetailApi(AgentApi):
    @extend_schema(
        operation_id="operations_get",
        responses={200: OperationOutputSerializer, **problem_responses(404)},
    )
    def get(self, request: Request, operation_id: Any) -> Response:
        operation = selectors.operation_get(
            tenant=self.tenant, operation_id=operation_id
        )
        return Response(OperationOutputSerializer(operation).data)


class OperationStartApi(AgentApi):
    @extend_schema(
        operation_id="operations_start",
        request=None,
        responses={
            200: OperationOutputSerializer,
            **problem_responses(404, 409, post=True),
        },
        parameters=[LEASE_HEADER, *POST_HEADERS],
        description="For an operation you execute yourself, on a target with no "
        "connector: mark it executing just before your call (one more attempt, same "
        "key), from reserved or unknown. 409 GATEWAY_GOVERNED on a target with a "
        "connector (execute it through the gateway); 409 ILLEGAL_TRANSITION from "
        "any other state (human_required is a person's to release).",
    )
    def post(self, request: Request, operation_id: Any) -> Response:
        operation = services.operation_begin_execution(
            tenant=self.tenant,
            operation_id=operation_id,
            lease_token=self.lease_token(request),
            actor=self.actor,
            trace=self.trace,
        )
        return Response(OperationOutputSerializer(operation).data)


class OperationOutcomeApi(AgentApi):
    @extend_schema_serializer(component_name="OperationOutcomeInput")
    class InputSerializer(StrictInput):
        outcome = serializers.ChoiceField(choices=services.OUTCOMES)
        provider_reference = serializers.CharField(max_length=200, required=False)
        result = JsonObjectField(required=False, help_text="Stored redacted.")
        reason_code = serializers.ChoiceField(
            choices=ReasonCode.choices, required=False
        )

    # The schema's two shapes: verified needs the receipt id (the service refuses
    # it otherwise); failed and unknown may carry one. oneOf, told apart by outcome.
    @extend_schema_serializer(component_name="OperationOutcomeVerified")
    class VerifiedSerializer(InputSerializer):
        outcome = serializers.ChoiceField(choices=[OperationState.VERIFIED])
        provider_reference = serializers.CharField(
            max_length=200, help_text="The provider's receipt id."
        )

    @extend_schema_serializer(component_name="OperationOutcomeNotVerified")
    class NotVerifiedSerializer(InputSerializer):
        outcome = serializers.ChoiceField(
            choices=[OperationState.FAILED, OperationState.UNKNOWN]
        )

    @extend_schema(
        operation_id="operations_report_outcome",
        request=PolymorphicProxySerializer(
            component_name="OperationOutcomeInput",
            serializers=[VerifiedSerializer, NotVerifiedSerializer],
            resource_type_field_name=None,
        ),
        responses={
            200: OperationOutputSerializer,
            **problem_responses(404, 409, post=True),
        },
        parameters=[LEASE_HEADER, *POST_HEADERS],
        description="Report what your own call did, on a target with no connector: "
        "verified (with the receipt id), failed, or unknown (RESULT_UNKNOWN). 409 "
        "GATEWAY_GOVERNED on a target with a connector: only the gateway records "
        "those outcomes.",
    )
    def post(self, request: Request, operation_id: Any) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        operation = services.operation_record_outcome(
            tenant=self.tenant,
            operation_id=operation_id,
            lease_token=self.lease_token(request),
            outcome=data["outcome"],
            provider_reference=data.get("provider_reference"),
            result=data.get("result"),
            reason=data.get("reason_code"),
            actor=self.actor,
            trace=self.trace,
        )
        return Response(OperationOutputSerializer(operation).data)


# --- Object versions ------------------------------------------------------------------


class ObjectVersionApi(AgentApi):
    @extend_schema_serializer(component_name="ObjectVersionInput")
    class InputSerializer(StrictInput):
        version = serializers.CharField(max_length=100)

    @extend_schema_serializer(component_name="ObjectVersionPath")
    class PathSerializer(QueryInput):
        object_type = serializers.CharField(max_length=100)
        object_id = serializers.CharField(max_length=200)

    @extend_schema(
        operation_id="object_versions_get",
        responses={200: ObjectVersionOutputSerializer, **problem_responses(404)},
    )
    def get(self, request: Request, object_type: str, object_id: str) -> Response:
        record = selectors.object_version_get(
            tenant=self.tenant, object_type=object_type, object_id=object_id
        )
        return Response(ObjectVersionOutputSerializer(record).data)

    @extend_schema(
        operation_id="object_versions_record",
        request=InputSerializer,
        responses={200: ObjectVersionOutputSerializer, **problem_responses()},
        description="Record the current version of a business object (the version "
        "fence compares a task's pinned version with this).",
    )
    def put(self, request: Request, object_type: str, object_id: str) -> Response:
        path = self.validated(
            self.PathSerializer, {"object_type": object_type, "object_id": object_id}
        )
        data = self.validated(self.InputSerializer, request.data)
        record: ObjectVersion = services.object_version_record(
            tenant=self.tenant, version=data["version"], **path
        )
        return Response(ObjectVersionOutputSerializer(record).data)


# --- The gateway ----------------------------------------------------------------------


class OperationExecuteApi(AgentApi):
    @extend_schema_serializer(component_name="OperationExecuteInput")
    class InputSerializer(StrictInput):
        field_values = serializers.ListField(
            child=FieldValueSerializer(),
            max_length=100,
            help_text="The fields you read, each with its source and when you read it.",
        )

    @extend_schema(
        operation_id="operations_execute",
        request=InputSerializer,
        responses={
            200: ExecutionOutputSerializer,
            202: ExecutionOutputSerializer,
            **problem_responses(403, 404, 409, 422, post=True),
        },
        parameters=[LEASE_HEADER, PREFER_HEADER, *POST_HEADERS],
        description="Execute through the gateway: contract, fields (value, source, "
        "observed_at), target, permission now, object-version fence, short-lived "
        "credential, then one call under the operation's key. You execute under "
        "your own grant: 403 ACTION_NOT_GRANTED if you hold none for the action and "
        "target (holding the lease is not enough). 200 with the outcome "
        "(verified, failed, or unknown while recovery looks the receipt up); 422 "
        "with the reason code (FIELD_STALE, VERSION_CONFLICT, …) when refused: the "
        "task then waits for a person.",
    )
    def post(self, request: Request, operation_id: Any) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        result = dispatch.operation_dispatch(
            tenant=self.tenant,
            operation_id=operation_id,
            lease_token=self.lease_token(request),
            actor=self.actor,
            trace=self.trace,
            fields=[gateway.FieldValue(**field) for field in data["field_values"]],
            respond_async=dispatch.prefers_respond_async(request.headers.get("Prefer")),
        )
        if result.outcome == "refused":
            raise gateway_refusal(str(result.reason))(
                operation_id=str(result.operation.pk),
                escalation_id=str(result.escalation_id),
                task_state="human_required",
            )
        return Response(
            status=202 if result.outcome == "queued" else 200,
            data=ExecutionOutputSerializer(
                {
                    "outcome": result.outcome,
                    "reason_code": result.reason,
                    "escalation_id": result.escalation_id,
                    "operation": result.operation,
                }
            ).data,
        )


# --- One governed action in one call -------------------------------------------------


class ActionTakeApi(AgentApi):
    @extend_schema_serializer(component_name="ActionInput")
    class InputSerializer(StrictInput):
        action = serializers.CharField(max_length=100)
        target = serializers.CharField(max_length=200)
        object_type = serializers.CharField(max_length=100)
        object_id = serializers.CharField(max_length=200)
        object_version = serializers.CharField(
            max_length=100, help_text="The version of the object you read."
        )
        # A declared field named like Serializer.fields: the metaclass moves it.
        fields = serializers.DictField(  # type: ignore[assignment]
            child=FieldReadSerializer(),
            help_text="The fields you read, by name: each value with its source and "
            "when you read it.",
        )
        arguments = CanonicalJsonValueField(
            allow_null=True,
            help_text="The action's input (hashed with RFC 8785 + SHA-256).",
        )
        idempotency_key = serializers.CharField(
            max_length=200,
            help_text="The business identity of the side effect (the operation key).",
        )
        contract_key = serializers.CharField(
            max_length=100,
            required=False,
            help_text="Omit to pin the one published contract for the object type "
            "that lists the target.",
        )
        contract_version = serializers.IntegerField(
            min_value=1, max_value=2**31 - 1, required=False
        )
        workflow_key = serializers.CharField(
            max_length=100, required=False, help_text="Default: the action."
        )
        workflow_version = serializers.CharField(max_length=50, required=False)
        client_task_id = serializers.CharField(
            max_length=200,
            required=False,
            help_text="Your name for the task (default: derived from "
            "idempotency_key); send the same one on every retry.",
        )

    @extend_schema(
        operation_id="actions_take",
        request=InputSerializer,
        responses={
            200: ActionOutputSerializer,
            202: ActionOutputSerializer,
            **problem_responses(403, 404, 409, 422, post=True),
        },
        parameters=[PREFER_HEADER, *POST_HEADERS],
        examples=[
            OpenApiExample(
                "Create a ticket",
                request_only=True,
                value={
                    "action": "create_ticket",
                    "target": "ticket-desk",
                    "object_type": "customer_issue",
                    "object_id": "1042",
                    "object_version": "7",
                    "fields": {
                        "email": {
                            "value": "ana@example.com",
                            "source": "crm",
                            "read_at": "2026-05-04T09:30:00Z",
                        },
                        "plan": {
                            "value": "pro",
                            "source": "billing",
                            "read_at": "2026-05-04T09:30:00Z",
                        },
                    },
                    "arguments": {"queue": "support", "summary": "Login fails"},
                    "idempotency_key": "ticket-for-issue-1042",
                },
            )
        ],
        description="One governed action in one call: register (or find) the task, "
        "lease it, reserve the operation under idempotency_key, and let the gateway "
        "check, call and verify; then settle the task. 200 with status verified, "
        "refused (reason_code, failed_check, failed_fields, desk_item_id), "
        "human_required (desk_item_id) or failed; 202 with status unknown (in doubt) "
        "or accepted (Prefer: respond-async) and Location: the operation to poll. "
        "The same idempotency_key with the same action, target, object and "
        "arguments answers the same operation and never calls twice; another "
        "action under the key answers 422 IDEMPOTENCY_KEY_REUSED, nothing run; a "
        "call with the same key still under way answers 409 REQUEST_IN_FLIGHT "
        "with Retry-After. 403 ACTION_NOT_GRANTED without a grant, nothing written.",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        take = actions.ActionRequest(
            action=data["action"],
            target=data["target"],
            object_type=data["object_type"],
            object_id=data["object_id"],
            object_version=data["object_version"],
            fields={
                name: actions.FieldRead(**read) for name, read in data["fields"].items()
            },
            arguments=data["arguments"],
            idempotency_key=data["idempotency_key"],
            contract_key=data.get("contract_key"),
            contract_version=data.get("contract_version"),
            workflow_key=data.get("workflow_key"),
            workflow_version=data.get("workflow_version", "1"),
            client_task_id=data.get("client_task_id"),
        )
        try:
            outcome = actions.action_take(
                agent=self.agent,
                request=take,
                respond_async=dispatch.prefers_respond_async(
                    request.headers.get("Prefer")
                ),
                trace=self.trace,
            )
        except ActionInFlight as busy:
            return self._in_flight(request, busy)
        settled = outcome.status not in ("unknown", "accepted")
        response = Response(
            ActionOutputSerializer(outcome).data, status=200 if settled else 202
        )
        if not settled:
            response["Location"] = outcome.status_url
        return response

    def _in_flight(self, request: Request, busy: ActionInFlight) -> Any:
        """409 with Retry-After; not stored under the Idempotency-Key header, so the
        same request retried later runs (the IETF draft's concurrent-request rule)."""
        record, self._idempotency_record = self._idempotency_record, None
        if record is not None:
            idempotency.idempotent_request_release(record_id=record)
        response = problem(
            status=busy.status,
            code=str(busy.code),
            detail=busy.detail,
            request=request,
            **busy.context,
        )
        response["Retry-After"] = str(busy.context.get("retry_after_s", 1))
        return response


# --- Contracts (read) -----------------------------------------------------------------


class ContractCollectionApi(AgentApi):
    @extend_schema_serializer(component_name="ContractListFilter")
    class FilterSerializer(QueryInput):
        key = serializers.CharField(max_length=100, required=False)

    @extend_schema(
        operation_id="contracts_list",
        parameters=[FilterSerializer],
        responses={200: ContractOutputSerializer(many=True), **problem_responses()},
        description="Your tenant's field contracts, every version. Agents read them; "
        "only tenant administrators change them (the /tenants/… endpoints).",
    )
    def get(self, request: Request) -> Response:
        filters = self.validated(self.FilterSerializer, request.query_params)
        contracts = selectors.contract_list(tenant=self.tenant, **filters)
        return Response(ContractOutputSerializer(contracts, many=True).data)


class ContractDetailApi(AgentApi):
    @extend_schema(
        operation_id="contracts_get",
        responses={200: ContractOutputSerializer, **problem_responses(404)},
    )
    def get(self, request: Request, key: str, version: int) -> Response:
        contract = selectors.contract_get(tenant=self.tenant, key=key, version=version)
        return Response(ContractOutputSerializer(contract).data)
