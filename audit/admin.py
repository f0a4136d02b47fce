"""Read-only admin for the audit trail: events can never be changed or deleted."""

from __future__ import annotations

from django.contrib import admin

from portal.admin import ReadOnlyAdmin

from .models import Event, Outbox


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
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
    date_hierarchy = "created_at"

    @admin.display(description="code", ordering="code")
    def event_code(self, event: Event) -> str:
        """The stable code itself (what exports and filters use), not its label."""
        return event.code


@admin.register(Outbox)
class OutboxAdmin(ReadOnlyAdmin):
    list_display = [
        "created_at",
        "topic",
        "key",
        "tenant",
        "state",
        "attempts",
        "sent_at",
    ]
    list_filter = ["state", "topic"]
    search_fields = ["=key"]
