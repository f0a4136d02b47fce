"""Tasks, operations, contracts, connectors and the rest of the governed domain."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.models import TenantPerm
from tasks import services as task_services
from tasks.contracts import contract_spec_validate
from tasks.exceptions import ContractInvalid
from tasks.models import (
    Approval,
    Connector,
    Contract,
    Credential,
    Escalation,
    ObjectVersion,
    Operation,
    Task,
)

from .base import TenantScopedAdmin


@admin.register(Task)
class TaskAdmin(TenantScopedAdmin):
    list_display = [
        "client_task_id",
        "tenant",
        "state",
        "state_version",
        "reason_code",
        "object_type",
        "object_id",
        "lease_owner",
        "updated_at",
    ]
    list_filter = ["state", "reason_code", "tenant"]
    search_fields = ["client_task_id", "object_id", "trace_id"]
    list_select_related = ["tenant"]


@admin.register(Operation)
class OperationAdmin(TenantScopedAdmin):
    list_display = [
        "idempotency_key",
        "tenant",
        "action",
        "target",
        "state",
        "attempts",
        "provider_reference",
        "updated_at",
    ]
    list_filter = ["state", "reason_code", "tenant"]
    search_fields = ["idempotency_key", "provider_reference", "trace_id"]
    list_select_related = ["tenant"]


class ContractVersionForm(forms.ModelForm):
    """A new version: key, tenant and spec; the service numbers and validates it."""

    publish = forms.BooleanField(required=False, help_text="Publish at once.")

    class Meta:
        model = Contract
        fields = ["tenant", "key", "spec"]

    def clean_spec(self) -> Any:
        spec = self.cleaned_data["spec"]
        try:
            contract_spec_validate(spec)
        except ContractInvalid as error:
            raise forms.ValidationError(
                [f"{p['path']}: {p['message']}" for p in error.context["problems"]]
            ) from error
        return spec


@admin.register(Contract)
class ContractAdmin(TenantScopedAdmin):
    """Versions are added through the validating service and never edited after."""

    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    list_display = ["key", "version", "tenant", "status", "published_at", "retired_at"]
    list_filter = ["status", "tenant"]
    search_fields = ["key"]
    list_select_related = ["tenant"]
    actions = ["publish_versions", "retire_versions"]
    form = ContractVersionForm

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # adding: the form's fields, "publish" included
            return ["tenant", "key", "spec", "publish"]
        return ["tenant", "key", "version", "status", "spec", "published_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return []
        return ["tenant", "key", "version", "status", "spec", "published_at"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a version's content is fixed once it exists; add a new one

    def save_model(
        self, request: HttpRequest, obj: Any, form: Any, change: bool
    ) -> None:
        created = task_services.contract_create(  # numbers the version, validates
            tenant=form.cleaned_data["tenant"],
            key=form.cleaned_data["key"],
            spec=form.cleaned_data["spec"],
            publish=form.cleaned_data["publish"],
            by=request.user,
        )
        self.adopt(obj, created)

    @admin.action(description="Publish selected draft versions", permissions=["manage"])
    def publish_versions(
        self, request: HttpRequest, queryset: QuerySet[Contract]
    ) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda contract: task_services.contract_publish(
                tenant=contract.tenant,
                key=contract.key,
                version=contract.version,
                by=request.user,
            ),
            "published",
        )

    @admin.action(
        description="Retire selected published versions", permissions=["manage"]
    )
    def retire_versions(
        self, request: HttpRequest, queryset: QuerySet[Contract]
    ) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda contract: task_services.contract_retire(
                tenant=contract.tenant,
                key=contract.key,
                version=contract.version,
                by=request.user,
            ),
            "retired",
        )


@admin.register(Credential)
class CredentialAdmin(TenantScopedAdmin):
    list_display = [
        "action",
        "target",
        "tenant",
        "issued_at",
        "expires_at",
        "revoked_at",
    ]
    list_select_related = ["tenant"]
    exclude = ["secret_hash"]


@admin.register(ObjectVersion)
class ObjectVersionAdmin(TenantScopedAdmin):
    list_display = ["object_type", "object_id", "version", "tenant", "updated_at"]
    search_fields = ["object_id"]
    list_select_related = ["tenant"]


class ConnectorForm(forms.ModelForm):
    """The key is write-only: blank keeps the stored one."""

    signing_key = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Signs the gateway's short-lived credentials. Leave blank to keep "
        "the current key; it is never shown again.",
    )

    # A base URL typed without a scheme means https (Django 6's default).
    base_url = forms.URLField(max_length=500, assume_scheme="https")

    class Meta:
        model = Connector
        fields = ["tenant", "target", *task_services.CONNECTOR_SETTINGS]


@admin.register(Connector)
class ConnectorAdmin(TenantScopedAdmin):
    """Targets the gateway may call. The signing key can be set, never read back."""

    view_perm = TenantPerm.MANAGE_TENANT
    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    form = ConnectorForm
    list_display = [
        "target",
        "tenant",
        "base_url",
        "supports_idempotency_keys",
        "supports_lookup",
        "max_attempts",
    ]
    list_filter = ["tenant"]
    list_select_related = ["tenant"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [] if obj is None else ["tenant", "target"]

    def save_model(
        self, request: HttpRequest, obj: Connector, form: Any, change: bool
    ) -> None:
        saved = task_services.connector_save(
            tenant=obj.tenant if change else form.cleaned_data["tenant"],
            target=obj.target if change else form.cleaned_data["target"],
            values={
                name: form.cleaned_data[name]
                for name in task_services.CONNECTOR_SETTINGS
            },
            signing_key=form.cleaned_data.get("signing_key") or None,
            by=request.user,
        )
        self.adopt(obj, saved)


@admin.register(Escalation)
class EscalationAdmin(TenantScopedAdmin):
    list_display = [
        "created_at",
        "reason_code",
        "tenant",
        "task",
        "responsible_owner",
        "resolution",
        "resolved_at",
    ]
    list_filter = ["reason_code", "resolution", "tenant"]
    list_select_related = ["tenant", "task"]


@admin.register(Approval)
class ApprovalAdmin(TenantScopedAdmin):
    list_display = ["operation", "tenant", "approved_by", "approved_at", "used_at"]
    list_select_related = ["tenant", "operation", "approved_by"]
