"""Staff endpoints (people, session-authenticated): human takeover, contract changes.

``StaffApi`` authenticates the Django session and checks CSRF; each service checks the
person's role in the tenant (docs/style.md R13). One view per operation (R11).
"""

from __future__ import annotations

from typing import Any

from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from drf_spectacular.utils import (
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from portal import selectors as portal_selectors
from portal.api import StaffApi, problem_responses
from portal.api_fields import OutputSerializer
from portal.api_input import QueryInput, StrictInput
from portal.codes import ReasonCode
from portal.models import TenantPerm

from .. import approvals, contracts, gateway, keyset, services, takeover
from .serializers import (
    ContractOutputSerializer,
    FieldValueSerializer,
    TakeoverEditOutputSerializer,
    TakeoverItemSerializer,
    TaskOutputSerializer,
)

# --- Human takeover -------------------------------------------------------------------


class TakeoverQueueApi(StaffApi):
    @extend_schema_serializer(component_name="TakeoverQueueFilter")
    class FilterSerializer(QueryInput):
        reason_code = serializers.ChoiceField(
            choices=ReasonCode.choices, required=False
        )
        order = serializers.ChoiceField(
            choices=["oldest", "newest"], default="oldest", required=False
        )
        after = serializers.CharField(
            max_length=200,
            required=False,
            help_text="The cursor of the page before (from its `next` link).",
        )
        page_size = serializers.IntegerField(
            min_value=1, max_value=keyset.MAX_PAGE_SIZE, required=False
        )

    @extend_schema(
        operation_id="takeover_queue",
        parameters=[FilterSerializer],
        responses={
            200: inline_serializer(
                "TakeoverQueuePage",
                fields={
                    "next": serializers.URLField(allow_null=True),
                    "results": TakeoverItemSerializer(many=True),
                },
            ),
            **problem_responses(400, 403, 404),
        },
        description="Tasks waiting for a person in your tenants, oldest first "
        "(`order=newest` for the other end), a page at a time: follow `next` until "
        "it is null. Also sets the CSRF cookie that the POSTs below must echo in "
        "X-CSRFToken.",
    )
    @method_decorator(ensure_csrf_cookie)
    def get(self, request: Request) -> Response:
        filters = self.validated(self.FilterSerializer, request.query_params)
        page = takeover.takeover_queue_page(
            user=request.user,
            reason=filters.get("reason_code"),
            newest_first=filters["order"] == "newest",
            after=filters.get("after"),
            limit=filters.get("page_size", keyset.DEFAULT_PAGE_SIZE),
        )
        next_url = None
        if page.next_cursor is not None:
            query = request.query_params.copy()
            query["after"] = page.next_cursor.encode()
            next_url = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return Response(
            {
                "next": next_url,
                "results": TakeoverItemSerializer(page.items, many=True).data,
            }
        )


class TakeoverClaimApi(StaffApi):
    @extend_schema(
        operation_id="takeover_claim",
        request=None,
        responses={200: TaskOutputSerializer, **problem_responses(403, 404, 409)},
        description="Claim a task: the automatic lease is revoked and the fencing "
        "token raised. 409 ALREADY_CLAIMED when someone was first.",
    )
    def post(self, request: Request, task_id: Any) -> Response:
        task = takeover.task_get_for_person(user=request.user, task_id=task_id)
        claimed = takeover.task_human_claim(
            task=task, user=request.user, trace=self.trace
        )
        return Response(TaskOutputSerializer(claimed).data)


class TakeoverReleaseApi(StaffApi):
    @extend_schema(
        operation_id="takeover_release",
        request=None,
        responses={200: TaskOutputSerializer, **problem_responses(403, 404, 409)},
    )
    def post(self, request: Request, task_id: Any) -> Response:
        task = takeover.task_get_for_person(user=request.user, task_id=task_id)
        released = takeover.task_human_release(
            task=task, user=request.user, trace=self.trace
        )
        return Response(TaskOutputSerializer(released).data)


class TakeoverResolveApi(StaffApi):
    @extend_schema_serializer(component_name="TakeoverResolveInput")
    class InputSerializer(StrictInput):
        resolution = serializers.ChoiceField(choices=takeover.RESOLUTIONS)
        operation_id = serializers.UUIDField(required=False)
        provider_reference = serializers.CharField(max_length=200, required=False)
        note = serializers.CharField(max_length=2000, required=False, default="")

    @extend_schema(
        operation_id="takeover_resolve",
        request=InputSerializer,
        responses={200: TaskOutputSerializer, **problem_responses(403, 404, 409)},
        description="Settle a claimed task: verify (with the receipt id you found), "
        "approve (same input, same key, once; `retry` is its older name; only for "
        "APPROVAL_REQUIRED, RESULT_UNKNOWN and CREDENTIAL_EXPIRED, otherwise 409 "
        "APPROVAL_NOT_ALLOWED), fail, cancel, hand_back (back to the agent for a "
        "fresh read, with a note) or complete. To give fresh field values "
        "yourself, use `edit`.",
    )
    def post(self, request: Request, task_id: Any) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        task = takeover.task_get_for_person(user=request.user, task_id=task_id)
        outcome = takeover.task_human_resolve(
            task=task, user=request.user, trace=self.trace, **data
        )
        return Response(TaskOutputSerializer(outcome.task).data)


class TakeoverEditApi(StaffApi):
    @extend_schema_serializer(component_name="TakeoverEditInput")
    class InputSerializer(StrictInput):
        operation_id = serializers.UUIDField()
        field_values = serializers.ListField(
            child=FieldValueSerializer(),
            min_length=1,
            max_length=100,
            help_text="Each field's fresh value, its source and when you read it.",
        )
        note = serializers.CharField(max_length=2000, required=False, default="")

    @extend_schema(
        operation_id="takeover_edit",
        request=InputSerializer,
        responses={
            200: TakeoverEditOutputSerializer,
            **problem_responses(403, 404, 409),
        },
        description="Give fresh field values for a task you claimed: the gateway "
        "checks everything again and executes under the operation's own key with "
        "you as the actor. `verified`: the task went back to the agent to finish. "
        "`refused`: it stays with you, with a new escalation and its reason code.",
    )
    def post(self, request: Request, task_id: Any) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        task = takeover.task_get_for_person(user=request.user, task_id=task_id)
        outcome = takeover.task_human_edit(
            task=task,
            user=request.user,
            operation_id=data["operation_id"],
            fields=[gateway.FieldValue(**field) for field in data["field_values"]],
            note=data["note"],
            trace=self.trace,
        )
        return Response(
            TakeoverEditOutputSerializer(
                {
                    "outcome": outcome.result.outcome,
                    "reason_code": outcome.result.reason,
                    "escalation_id": outcome.result.escalation_id,
                    "operation": outcome.result.operation,
                    "task": outcome.task,
                }
            ).data
        )


# --- Approvals (issue 21 §2, docs/approvals.md) ---------------------------------------


class ApprovalOutputSerializer(OutputSerializer):
    id = serializers.UUIDField()
    tenant = serializers.CharField(source="tenant.slug")
    operation_id = serializers.UUIDField()
    state = serializers.CharField()
    quorum = serializers.IntegerField()
    approvals = serializers.SerializerMethodField()
    groups = serializers.ListField(child=serializers.CharField())
    sponsor_excluded = serializers.BooleanField()
    asked = serializers.JSONField(help_text="What is asked, redacted.")
    requested_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)

    def get_approvals(self, approval: Any) -> int:
        return approval.decisions.filter(verdict="approve").count()


class ApprovalListApi(StaffApi):
    @extend_schema(
        operation_id="approvals_waiting",
        responses={
            200: ApprovalOutputSerializer(many=True),
            **problem_responses(400, 403),
        },
        description="Waiting approvals in your tenants, oldest first (at most 200). "
        "Also sets the CSRF cookie that the POSTs below must echo in X-CSRFToken.",
    )
    @method_decorator(ensure_csrf_cookie)
    def get(self, request: Request) -> Response:
        for tenant in takeover.takeover_tenants(user=request.user):
            approvals.approvals_expire(tenant=tenant)
        waiting = approvals.approvals_waiting_for(user=request.user)[:200]
        return Response(ApprovalOutputSerializer(waiting, many=True).data)


class ApprovalDecideApi(StaffApi):
    """Approve or reject; the verdict comes from the URL."""

    verdict: str = ""

    @extend_schema_serializer(component_name="ApprovalDecisionInput")
    class InputSerializer(StrictInput):
        reason = serializers.CharField(
            max_length=2000,
            required=False,
            default="",
            help_text="Why (required to reject).",
        )

    @extend_schema(
        request=InputSerializer,
        responses={
            200: ApprovalOutputSerializer,
            **problem_responses(400, 403, 404, 409),
        },
        description="Your decision on a waiting approval. 409 APPROVAL_NOT_ALLOWED: "
        "not in the group the policy names, the agent's sponsor where the policy "
        "separates them, decided by you already, or not waiting; 409 "
        "APPROVAL_EXPIRED: its window passed (recorded as expired). The quorum's "
        "last approval makes it approved and hands the task back to the agent.",
    )
    def post(self, request: Request, approval_id: Any) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        approval = takeover.approval_decide(
            approval_id=approval_id,
            user=request.user,
            verdict=self.verdict,
            reason=data["reason"],
            trace=self.trace,
        )
        return Response(ApprovalOutputSerializer(approval).data)


class ApprovalApproveApi(ApprovalDecideApi):
    verdict = "approve"


class ApprovalRejectApi(ApprovalDecideApi):
    verdict = "reject"


# --- Contracts (tenant administrators) ------------------------------------------------


@extend_schema_field(
    {k: v for k, v in contracts.CONTRACT_SPEC_SCHEMA.items() if k != "$schema"}
)
class ContractSpecField(serializers.JSONField):
    """A contract spec; the service checks it against the same JSON Schema."""


class TenantContractCreateApi(StaffApi):
    @extend_schema_serializer(component_name="ContractCreateInput")
    class InputSerializer(StrictInput):
        key = serializers.SlugField(max_length=100)
        spec = ContractSpecField(
            help_text="The contract spec. Its required fields' names must differ."
        )
        publish = serializers.BooleanField(default=False)

    @extend_schema(
        operation_id="tenant_contracts_create",
        request=InputSerializer,
        responses={201: ContractOutputSerializer, **problem_responses(403, 404)},
        description="Create the next version of a contract (tenant administrators). "
        "400 CONTRACT_INVALID lists every problem with its JSON path.",
    )
    def post(self, request: Request, tenant_slug: str) -> Response:
        data = self.validated(self.InputSerializer, request.data)
        tenant = portal_selectors.tenant_for_person(
            user=request.user, slug=tenant_slug, perm=TenantPerm.MANAGE_TENANT
        )
        contract = services.contract_create(tenant=tenant, by=request.user, **data)
        return Response(ContractOutputSerializer(contract).data, status=201)


class TenantContractStatusApi(StaffApi):
    """Publish or retire a version; ``action`` comes from the URL."""

    action_name: str = ""

    @extend_schema(
        request=None,
        responses={200: ContractOutputSerializer, **problem_responses(403, 404, 409)},
    )
    def post(
        self, request: Request, tenant_slug: str, key: str, version: int
    ) -> Response:
        tenant = portal_selectors.tenant_for_person(
            user=request.user, slug=tenant_slug, perm=TenantPerm.MANAGE_TENANT
        )
        change = (
            services.contract_publish
            if self.action_name == "publish"
            else services.contract_retire
        )
        contract = change(tenant=tenant, key=key, version=version, by=request.user)
        return Response(ContractOutputSerializer(contract).data)


class TenantContractPublishApi(TenantContractStatusApi):
    action_name = "publish"


class TenantContractRetireApi(TenantContractStatusApi):
    action_name = "retire"
