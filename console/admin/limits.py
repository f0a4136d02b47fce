"""The kill switch's and the limits' pages: per-agent rate limits and budgets.

Tenant administrators add, change and delete them (each change an ``agent.changed``
event naming the person, through ``limits.services``); compliance reviewers read
them (``export_trail``); support staff do not see them. Each row shows what its
latest window has used (docs/limits.md).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from limits import services as limits_services
from limits.models import Budget, LimitUsage, RateLimit
from portal.models import TenantPerm

from .base import TenantScopedAdmin


class _LimitAdmin(TenantScopedAdmin):
    # Reviewers read limits (with the trail they export); support staff do not.
    view_perm = TenantPerm.EXPORT_TRAIL
    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    list_select_related = ["tenant", "agent"]
    autocomplete_fields = ["agent"]
    search_fields = ["agent__name", "action", "target"]
    actions = ["delete_limits"]
    usage_field: str = ""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The agent fixes the tenant, which its usage rows point at.
        return ["used_now"] if obj is None else ["agent", "used_now"]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="used (latest window)")
    def used_now(self, obj: RateLimit | Budget) -> str:
        if obj.pk is None:
            return "-"
        usage = (
            LimitUsage.objects.filter(
                tenant_id=obj.tenant_id, **{self.usage_field: obj}
            )
            .order_by("-window_start")
            .first()
        )
        if usage is None:
            return "0"
        since = usage.window_start.strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{usage.used.normalize()} of {usage.allowed.normalize()} since {since}"

    def save_model(
        self, request: HttpRequest, obj: Any, form: Any, change: bool
    ) -> None:
        agent = form.cleaned_data.get("agent") or obj.agent
        saved = limits_services.limit_save(
            tenant=agent.tenant, limit=obj, by=request.user
        )
        self.adopt(obj, saved)

    @admin.action(description="Delete selected (audited)", permissions=["manage"])
    def delete_limits(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda limit: limits_services.limit_delete(
                tenant=limit.tenant, limit=limit, by=request.user
            ),
            "deleted",
        )


@admin.register(RateLimit)
class RateLimitAdmin(_LimitAdmin):
    """At most N reservations of an action on a target per window, per agent."""

    usage_field = "rate_limit"
    list_display = [
        "agent",
        "action",
        "target",
        "max_calls",
        "window_s",
        "used_now",
        "tenant",
    ]
    list_filter = ["tenant", "action"]
    fields = ["agent", "action", "target", "max_calls", "window_s", "used_now"]


@admin.register(Budget)
class BudgetAdmin(_LimitAdmin):
    """At most a total of one input amount per window (a day by default), per agent."""

    usage_field = "budget"
    list_display = [
        "agent", "action", "target", "argument", "max_total", "window_s", "used_now",
        "tenant",
    ]  # fmt: skip
    list_filter = ["tenant", "action"]
    fields = [
        "agent",
        "action",
        "target",
        "argument",
        "max_total",
        "window_s",
        "used_now",
    ]
