"""Admin for tenancy and identity, and the read-only base the other apps share."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from . import services
from .models import Agent, AgentKey, Membership, Tenant


class ReadOnlyAdmin(admin.ModelAdmin):
    """Look, never touch: changes go through services (STYLE.md R13)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: Model | None = None
    ) -> bool:
        return False

    def has_delete_permission(
        self, request: HttpRequest, obj: Model | None = None
    ) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "events_on_delete", "created_at", "deleted_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["id", "created_at", "deleted_at"]

    def has_delete_permission(
        self, request: HttpRequest, obj: Model | None = None
    ) -> bool:
        return False  # tenants are deleted by policy: manage.py delete_tenant


class AgentKeyInline(admin.TabularInline):
    model = AgentKey
    fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "is_active", "created_at"]
    list_filter = ["is_active", "tenant"]
    search_fields = ["name"]
    readonly_fields = ["id", "created_at"]
    inlines = [AgentKeyInline]
    actions = ["issue_key"]

    @admin.action(description="Issue a new API key (shown once)")
    def issue_key(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for agent in queryset:
            issued = services.agent_key_issue(agent=agent)
            self.message_user(
                request,
                f"New key for {agent.name}: {issued.secret} — copy it now; only its "
                "hash is stored.",
                messages.WARNING,
            )


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username"]
