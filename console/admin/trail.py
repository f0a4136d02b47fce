"""The audit trail: events (append-only) and the outbox that carries them out."""

from __future__ import annotations

from django.contrib import admin

from audit.models import Event, Outbox
from portal.models import TenantPerm

from .base import TenantScopedAdmin


@admin.register(Event)
class EventAdmin(TenantScopedAdmin):
    list_display = [
        "created_at",
        "event_code",
        "tenant",
        "actor_type",
        "actor_id",
        "reason_code",
        "task_id",
        "trace_id",
    ]
    list_filter = ["code", "actor_type", "reason_code", "tenant"]
    search_fields = ["=task_id", "=operation_id", "=trace_id", "actor_id"]
    list_select_related = ["tenant"]

    @admin.display(description="code", ordering="code")
    def event_code(self, event: Event) -> str:
        """The stable code itself (what exports and filters use), not its label."""
        return event.code


@admin.register(Outbox)
class OutboxAdmin(TenantScopedAdmin):
    view_perm = TenantPerm.MANAGE_OUTBOX
    list_display = [
        "created_at",
        "topic",
        "key",
        "tenant",
        "state",
        "attempts",
        "sent_at",
    ]
    list_filter = ["state", "tenant"]
    search_fields = ["=key"]
    list_select_related = ["tenant"]
