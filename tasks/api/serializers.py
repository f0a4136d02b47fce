"""Request and response shapes shared by the task API's views (plain serializers).

Output serializers only read attributes; nothing here queries or writes (docs/style.md
R2, R11). A view's own input, filter and path serializers stay nested in the view.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from audit.models import EventCode
from portal.api_fields import OutputSerializer
from portal.api_input import JsonValueField, StrictInput
from portal.codes import ReasonCode

from ..models import OperationState, Task, TaskState

# --- Output ---------------------------------------------------------------------------


class LeaseOutputSerializer(OutputSerializer):
    owner = serializers.CharField(allow_null=True)
    token = serializers.IntegerField(help_text="Fencing token: send it as Lease-Token.")
    acquired_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)


class TaskWorkflowSerializer(OutputSerializer):
    key = serializers.CharField()
    version = serializers.CharField()


class TaskContractSerializer(OutputSerializer):
    key = serializers.CharField()
    version = serializers.IntegerField()


class TaskObjectSerializer(OutputSerializer):
    type = serializers.CharField()
    id = serializers.CharField()
    version = serializers.CharField()


class TaskOutputSerializer(OutputSerializer):
    id = serializers.UUIDField()
    client_task_id = serializers.CharField()
    workflow = serializers.SerializerMethodField()
    contract = serializers.SerializerMethodField()
    object = serializers.SerializerMethodField()
    state = serializers.ChoiceField(choices=TaskState.choices)
    state_version = serializers.IntegerField()
    current_step = serializers.CharField()
    wake_at = serializers.DateTimeField(allow_null=True)
    reason_code = serializers.ChoiceField(choices=ReasonCode.choices, allow_null=True)
    lease = serializers.SerializerMethodField()
    trace_id = serializers.CharField()
    span_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(TaskWorkflowSerializer)
    def get_workflow(self, task: Task) -> dict[str, Any]:
        return {"key": task.workflow_key, "version": task.workflow_version}

    @extend_schema_field(TaskContractSerializer(allow_null=True))
    def get_contract(self, task: Task) -> dict[str, Any] | None:
        if task.contract_key is None:
            return None
        return {"key": task.contract_key, "version": task.contract_version}

    @extend_schema_field(TaskObjectSerializer)
    def get_object(self, task: Task) -> dict[str, Any]:
        return {
            "type": task.object_type,
            "id": task.object_id,
            "version": task.object_version,
        }

    @extend_schema_field(LeaseOutputSerializer)
    def get_lease(self, task: Task) -> dict[str, Any]:
        return {
            "owner": task.lease_owner,
            "token": task.lease_token,
            "acquired_at": task.lease_acquired_at,
            "expires_at": task.lease_expires_at,
        }


class OperationOutputSerializer(OutputSerializer):
    id = serializers.UUIDField()
    task_id = serializers.UUIDField()
    idempotency_key = serializers.CharField()
    action = serializers.CharField()
    target = serializers.CharField()
    input_hash = serializers.CharField(help_text="SHA-256 of RFC 8785 canonical JSON.")
    state = serializers.ChoiceField(choices=OperationState.choices)
    state_version = serializers.IntegerField()
    reason_code = serializers.ChoiceField(choices=ReasonCode.choices, allow_null=True)
    attempts = serializers.IntegerField()
    provider_reference = serializers.CharField(allow_null=True)
    result = serializers.JSONField(allow_null=True, help_text="Redacted.")
    trace_id = serializers.CharField()
    span_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ObjectVersionOutputSerializer(OutputSerializer):
    object_type = serializers.CharField()
    object_id = serializers.CharField()
    version = serializers.CharField()
    updated_at = serializers.DateTimeField()


class EventOutputSerializer(OutputSerializer):
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


class ExecutionOutputSerializer(OutputSerializer):
    outcome = serializers.ChoiceField(
        choices=["verified", "failed", "unknown", "conflict", "refused", "queued"]
    )
    reason_code = serializers.CharField(allow_null=True)
    escalation_id = serializers.UUIDField(allow_null=True)
    operation = OperationOutputSerializer()


class EscalationOutputSerializer(OutputSerializer):
    id = serializers.UUIDField()
    operation_id = serializers.UUIDField(allow_null=True)
    reason_code = serializers.CharField()
    evidence = serializers.JSONField()
    responsible_owner = serializers.CharField()
    created_at = serializers.DateTimeField()
    resolved_at = serializers.DateTimeField(allow_null=True)
    resolution = serializers.CharField()


class TakeoverItemSerializer(TaskOutputSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    escalations = serializers.SerializerMethodField()

    @extend_schema_field(EscalationOutputSerializer(many=True))
    def get_escalations(self, task: Task) -> Any:
        records = task.escalations.order_by("-created_at")[:5]
        return EscalationOutputSerializer(records, many=True).data


class ContractOutputSerializer(OutputSerializer):
    key = serializers.CharField()
    version = serializers.IntegerField()
    status = serializers.CharField()
    spec = serializers.JSONField()
    created_at = serializers.DateTimeField()
    published_at = serializers.DateTimeField(allow_null=True)
    retired_at = serializers.DateTimeField(allow_null=True)


# --- Input shared by several views ---------------------------------------------------


class LeaseInputSerializer(StrictInput):
    owner = serializers.CharField(max_length=200)
    ttl_s = serializers.IntegerField(min_value=1, max_value=3600, required=False)


class RenewInputSerializer(StrictInput):
    ttl_s = serializers.IntegerField(min_value=1, max_value=3600, required=False)


class FieldValueSerializer(StrictInput):
    name = serializers.CharField(max_length=100)
    value = JsonValueField(allow_null=True)
    # A declared field named like Field.source: the metaclass moves it, so it works.
    source = serializers.CharField(max_length=100)  # type: ignore[assignment]
    observed_at = serializers.DateTimeField()


class TakeoverEditOutputSerializer(OutputSerializer):
    outcome = serializers.CharField()
    reason_code = serializers.CharField(allow_null=True)
    escalation_id = serializers.UUIDField(allow_null=True)
    operation = OperationOutputSerializer()
    task = TaskOutputSerializer()


# --- One governed action in one call (POST /api/v1/actions) ---------------------------


class FieldReadSerializer(StrictInput):
    value = JsonValueField(allow_null=True)
    # A declared field named like Field.source: the metaclass moves it, so it works.
    source = serializers.CharField(max_length=100)  # type: ignore[assignment]
    read_at = serializers.DateTimeField(help_text="When you read the value.")


class ActionOutputSerializer(OutputSerializer):
    status = serializers.ChoiceField(
        choices=[
            "verified",
            "refused",
            "human_required",
            "unknown",
            "accepted",
            "failed",
        ],
        help_text="What the action came to; next_step says what to do.",
    )
    next_step = serializers.CharField()
    status_url = serializers.CharField(help_text="GET it to follow the operation.")
    operation_id = serializers.UUIDField()
    task_id = serializers.UUIDField()
    operation_state = serializers.ChoiceField(choices=OperationState.choices)
    task_state = serializers.ChoiceField(choices=TaskState.choices)
    created = serializers.BooleanField(
        help_text="True when this request reserved the operation."
    )
    reason_code = serializers.CharField(allow_null=True)
    failed_check = serializers.CharField(
        allow_null=True, help_text="The gateway check that refused (e.g. fields)."
    )
    failed_fields = serializers.ListField(child=serializers.CharField())
    provider_reference = serializers.CharField(
        allow_null=True, help_text="The receipt id (verified)."
    )
    result = serializers.JSONField(allow_null=True, help_text="Redacted.")
    desk_item_id = serializers.UUIDField(
        allow_null=True, help_text="The takeover desk's item (escalation) id."
    )
    attempts = serializers.IntegerField()
    details = serializers.JSONField(
        help_text="For a refusal: the facts on each failed field (no values)."
    )
