"""Read-only admin for the task domain; the reviewer and support portal comes later."""

from __future__ import annotations

from django.contrib import admin

from portal.admin import ReadOnlyAdmin

from .models import Contract, Credential, ObjectVersion, Operation, Task


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
