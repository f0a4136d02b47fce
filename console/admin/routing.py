"""Routing's set-up pages: groups and their members, rules per reason code, and
the tenant's webhooks (docs/routing.md).

Tenant administrators add and change them (each change a ``tenant.changed`` event
naming the person, through ``routing.services``); reviewers read groups, members
and rules; every member chooses e-mail on or off for their own rows; a webhook's
page, with its signing secret, is for administrators only.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.exceptions import PortalError
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
    """A person in a group, and whether they get its items by e-mail.

    Everyone who reads the page chooses for themself with the two e-mail actions
    (their own rows only); administrators also change anyone's row on its page.
    """

    list_display = ["user", "group", "email_enabled", "tenant"]
    list_filter = ["tenant", "group"]
    list_select_related = ["tenant", "group", "user"]
    fields = ["tenant", "group", "user", "email_enabled"]
    actions = ["email_me", "no_email_for_me", "delete_rows"]

    @admin.action(description="E-mail me these groups' items", permissions=["view"])
    def email_me(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._choose(request, queryset, email_enabled=True)

    @admin.action(description="No e-mail to me for these groups", permissions=["view"])
    def no_email_for_me(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._choose(request, queryset, email_enabled=False)

    def _choose(
        self, request: HttpRequest, queryset: QuerySet[Any], *, email_enabled: bool
    ) -> None:
        mine = queryset.filter(user_id=request.user.pk).select_related(
            "tenant", "group"
        )
        skipped = queryset.count() - mine.count()
        for row in mine.order_by("pk"):
            try:
                routing_services.member_email_choose(
                    tenant=row.tenant,
                    member_id=row.pk,
                    user=request.user,
                    email_enabled=email_enabled,
                )
            except (PortalError, DjangoPermissionDenied) as error:
                self.message_user(request, f"{row}: {error}", messages.ERROR)
            else:
                state = "on" if email_enabled else "off"
                self.message_user(request, f"{row.group}: e-mail {state} for you.")
        if skipped:
            self.message_user(
                request,
                f"{skipped} selected row(s) skipped: you choose for yourself only "
                "(administrators change another person's row on its page).",
                messages.WARNING,
            )


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
