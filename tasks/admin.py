"""Read-only admin for the task domain; the reviewer and support portal comes later."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.admin import ReadOnlyAdmin
from portal.exceptions import PortalError

from . import services
from .contracts import contract_spec_validate
from .exceptions import ContractInvalid
from .models import (
    Approval,
    Connector,
    Contract,
    Credential,
    Escalation,
    ObjectVersion,
    Operation,
    Task,
)


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
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
class OperationAdmin(ReadOnlyAdmin):
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
class ContractAdmin(admin.ModelAdmin):
    """Versions are added through the validating service and never edited after."""

    list_display = ["key", "version", "tenant", "status", "published_at", "retired_at"]
    list_filter = ["status", "tenant"]
    search_fields = ["key"]
    actions = ["publish_versions", "retire_versions"]
    form = ContractVersionForm

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # adding: the form's fields, "publish" included
            return ["tenant", "key", "spec", "publish"]
        return [
            "tenant",
            "key",
            "version",
            "status",
            "spec",
            "published_at",
            "retired_at",
        ]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a version's content is fixed once it exists; add a new one

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        # The service opens its own durable transaction (STYLE.md R5); the admin
        # would wrap the save in another, so take its view without that wrapper.
        return self._changeform_view(  # type: ignore[attr-defined]
            request, object_id, form_url, extra_context
        )

    def save_model(
        self, request: HttpRequest, obj: Any, form: Any, change: bool
    ) -> None:
        created = services.contract_create(  # numbers the version, validates again
            tenant=form.cleaned_data["tenant"],
            key=form.cleaned_data["key"],
            spec=form.cleaned_data["spec"],
            publish=form.cleaned_data["publish"],
        )
        obj.pk, obj.version = created.pk, created.version

    @admin.action(description="Publish selected draft versions")
    def publish_versions(
        self, request: HttpRequest, queryset: QuerySet[Contract]
    ) -> None:
        self._change(request, queryset, services.contract_publish, "published")

    @admin.action(description="Retire selected published versions")
    def retire_versions(
        self, request: HttpRequest, queryset: QuerySet[Contract]
    ) -> None:
        self._change(request, queryset, services.contract_retire, "retired")

    def _change(
        self, request: HttpRequest, queryset: QuerySet[Contract], change: Any, word: str
    ) -> None:
        for contract in queryset.select_related("tenant").order_by("pk"):
            try:
                change(
                    tenant=contract.tenant, key=contract.key, version=contract.version
                )
            except PortalError as error:
                self.message_user(
                    request, f"{contract}: {error.detail}", messages.ERROR
                )
            else:
                self.message_user(
                    request, f"{contract.key} v{contract.version} {word}."
                )


@admin.register(Credential)
class CredentialAdmin(ReadOnlyAdmin):
    list_display = [
        "action",
        "target",
        "tenant",
        "issued_at",
        "expires_at",
        "revoked_at",
    ]
    exclude = ["secret_hash"]


@admin.register(ObjectVersion)
class ObjectVersionAdmin(ReadOnlyAdmin):
    list_display = ["object_type", "object_id", "version", "tenant", "updated_at"]
    search_fields = ["object_id"]


@admin.register(Connector)
class ConnectorAdmin(admin.ModelAdmin):
    """Targets the gateway may call. The signing key can be set, never read back."""

    list_display = [
        "target",
        "tenant",
        "base_url",
        "supports_idempotency_keys",
        "supports_lookup",
        "max_attempts",
    ]
    list_filter = ["tenant"]
    readonly_fields = ["id", "created_at"]
    # A base URL typed without a scheme means https (Django 6's default already).
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def get_form(
        self,
        request: HttpRequest,
        obj: Any = None,
        change: bool = False,
        **kwargs: Any,
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        # Render the key as a password input that never shows the stored value.
        form.base_fields["signing_key"].widget = forms.PasswordInput(render_value=False)
        form.base_fields["signing_key"].required = obj is None
        return form

    def save_model(
        self, request: HttpRequest, obj: Any, form: Any, change: bool
    ) -> None:
        if change and not form.cleaned_data.get("signing_key"):
            obj.signing_key = type(obj).objects.get(pk=obj.pk).signing_key  # keep it
        super().save_model(request, obj, form, change)


@admin.register(Escalation)
class EscalationAdmin(ReadOnlyAdmin):
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
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ["operation", "tenant", "approved_by", "approved_at", "used_at"]
    list_select_related = ["tenant", "operation", "approved_by"]
