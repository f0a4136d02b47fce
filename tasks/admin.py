"""Read-only admin for the task domain; the reviewer and support portal comes later."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from portal.admin import ReadOnlyAdmin

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


@admin.register(Contract)
class ContractAdmin(ReadOnlyAdmin):
    list_display = ["key", "version", "tenant", "status", "published_at", "retired_at"]
    list_filter = ["status", "tenant"]
    search_fields = ["key"]


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
