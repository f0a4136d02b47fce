"""Routing's set-up pages: groups and their members, rules per reason code, and
the tenant's webhooks (docs/routing.md).

Tenant administrators add and change them (each change a ``tenant.changed`` event
naming the person, through ``routing.services``); reviewers read groups, members
and rules; a webhook's page, with its signing secret, is for administrators only.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.models import TenantPerm
from routing import delivery
from routing import services as routing_services
from routing.models import Group, GroupMember, RoutingRule, Webhook
from tasks import outbound

from .base import TenantScopedAdmin


class _SetupAdmin(TenantScopedAdmin):
    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    list_select_related = ["tenant"]
    actions = ["delete_rows"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A row's tenant is fixed once it exists: its references depend on it.
        return [] if obj is None else ["tenant"]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def save_model(
        self, request: HttpRequest, obj: Any, form: Any, change: bool
    ) -> None:
        tenant = form.cleaned_data.get("tenant") or obj.tenant
        saved = routing_services.setup_save(tenant=tenant, row=obj, user=request.user)
        self.adopt(obj, saved)

    @admin.action(description="Delete selected (audited)", permissions=["manage"])
    def delete_rows(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda row: routing_services.setup_delete(
                tenant=row.tenant, row=row, user=request.user
            ),
            "deleted",
        )


@admin.register(Group)
class GroupAdmin(_SetupAdmin):
    """A team desk items go to."""

    list_display = ["name", "tenant"]
    list_filter = ["tenant"]
    search_fields = ["name"]
    fields = ["tenant", "name"]


@admin.register(GroupMember)
class GroupMemberAdmin(_SetupAdmin):
    """A person in a group, and whether they get its items by e-mail."""

    list_display = ["user", "group", "email_enabled", "tenant"]
    list_filter = ["tenant", "group"]
    list_select_related = ["tenant", "group", "user"]
    fields = ["tenant", "group", "user", "email_enabled"]


@admin.register(RoutingRule)
class RoutingRuleAdmin(_SetupAdmin):
    """Where a reason code's items go, and their SLA (empty code: the default)."""

    list_display = [
        "reason_code", "group", "backup_group", "remind_after_s", "escalate_after_s",
        "tenant",
    ]  # fmt: skip
    list_filter = ["tenant"]
    list_select_related = ["tenant", "group", "backup_group"]
    fields = [
        "tenant",
        "reason_code",
        "group",
        "backup_group",
        "remind_after_s",
        "escalate_after_s",
    ]


class WebhookForm(forms.ModelForm):
    class Meta:
        model = Webhook
        fields = ["tenant", "url", "enabled"]

    def clean_url(self) -> str:
        url: str = self.cleaned_data["url"]
        problem = outbound.base_url_problem(url)
        if problem:
            raise forms.ValidationError(
                f"The outbound URL policy refuses it: {problem}"
            )
        return url


@admin.register(Webhook)
class WebhookAdmin(_SetupAdmin):
    """A Slack-compatible endpoint; its secret signs every post (HMAC-SHA256)."""

    view_perm = TenantPerm.MANAGE_TENANT
    form = WebhookForm
    list_display = ["url", "enabled", "tenant"]
    list_filter = ["tenant"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["tenant", "url", "enabled"] + ([] if obj is None else ["secret"])

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [] if obj is None else ["tenant", "secret"]

    @admin.display(description="signing secret (give it to the receiver)")
    def secret(self, obj: Webhook) -> str:
        return delivery.webhook_secret(webhook=obj)
