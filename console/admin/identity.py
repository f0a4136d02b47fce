"""Tenants, agents, keys, grants and memberships: a tenant admin's set-up pages."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from console import invitations, services
from console.once import ONCE_FIELD, once_spend, once_token
from limits import services as limits_services
from portal.exceptions import PortalError
from portal.models import (
    Agent,
    AgentGrant,
    AgentKey,
    Invitation,
    Membership,
    Role,
    Tenant,
    TenantPerm,
)

from .base import TenantScopedAdmin, tenant_ids


@dataclass(frozen=True, kw_only=True)
class NewKey:
    """One row of the page that shows new secrets once."""

    agent: str
    prefix: str
    what: str
    secret: str


def new_keys_page(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, new_keys: list[NewKey]
) -> TemplateResponse | None:
    """The answer to the action's POST that shows each new secret once.

    The secret travels in this page only: not in a message (Django's message
    cookie is signed, not encrypted), the session, a redirect or a log. None when
    no key was issued: the changelist's redirect then shows the messages.
    """
    if not new_keys:
        return None
    opts = model_admin.model._meta
    return TemplateResponse(
        request,
        "admin/console/new_keys.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": "New API keys: copy the secrets now",
            "opts": opts,
            "new_keys": new_keys,
            "next_url": request.get_full_path(),
        },
    )


class OnceActionForm(ActionForm):
    """The action bar with a one-time token (console/once.py): an action that makes
    a key spends it, so the same page posted twice makes one key."""

    once = forms.CharField(required=False, label="", widget=forms.HiddenInput)


class OnceActions(TenantScopedAdmin):
    """A list whose action bar carries a fresh one-time token on every render."""

    action_form = OnceActionForm

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None) or {}
        if context.get("action_form") is not None:
            context["action_form"].initial[ONCE_FIELD] = once_token(user=request.user)
        return response

    def spend_once(self, request: HttpRequest) -> bool:
        """Spend the posted page's token; False (and a message) if it was spent or
        is not valid: the action then makes nothing."""
        try:
            once_spend(user=request.user, token=request.POST.get(ONCE_FIELD, ""))
        except PortalError as error:
            self.message_user(request, error.detail, messages.ERROR)
            return False
        return True


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    """Your tenants. Admins change the name; the deletion policy for events is chosen
    when the platform operator makes the tenant, and changed by the operator role
    alone (docs/tenant-deletion.md)."""

    tenant_field = ""
    view_perm = TenantPerm.VIEW_TRAIL
    manage_perm = TenantPerm.MANAGE_TENANT
    list_display = ["slug", "name", "events_on_delete", "frozen_at", "created_at"]
    search_fields = ["slug", "name"]
    fields = [
        "slug", "name", "events_on_delete", "created_at", "deleted_at", "frozen_at",
    ]  # fmt: skip
    actions = ["freeze", "unfreeze"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["created_at", "deleted_at", "frozen_at"]
        return ["slug", "events_on_delete", "created_at", "deleted_at", "frozen_at"]

    # The kill switch (docs/limits.md): every call of the tenant's agents refused.
    @admin.action(
        description="Freeze: refuse every call of its agents", permissions=["manage"]
    )
    def freeze(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self.run_service(
            request,
            queryset,
            lambda tenant: limits_services.tenant_freeze(
                tenant=tenant, by=request.user
            ),
            "frozen",
        )

    @admin.action(description="Unfreeze", permissions=["manage"])
    def unfreeze(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self.run_service(
            request,
            queryset,
            lambda tenant: limits_services.tenant_freeze(
                tenant=tenant, by=request.user, frozen=False
            ),
            "unfrozen",
        )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)  # the platform operator makes tenants

    def add_view(
        self,
        request: HttpRequest,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """"Add tenant" is the operator's new-tenant page (console/tenant_page.py),
        the one way a tenant is made with its first event and administrator."""
        if not self.has_add_permission(request):
            raise DjangoPermissionDenied
        return HttpResponseRedirect(reverse("admin:tenant_new"))

    def save_model(
        self, request: HttpRequest, obj: Tenant, form: Any, change: bool
    ) -> None:
        services.tenant_update(
            tenant=Tenant.objects.get(pk=obj.pk),
            by=request.user,
            name=form.cleaned_data["name"],
        )


class AgentKeyInline(admin.TabularInline):
    model = AgentKey
    fields = ("prefix", "created_at", "last_used_at", "expires_at", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(tenant_ids(request, TenantPerm.MANAGE_TENANT))


@admin.register(Agent)
class AgentAdmin(OnceActions):
    """Agents (API identities). Keys are issued here and shown exactly once."""

    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    list_display = [
        "name",
        "tenant",
        "is_active",
        "trust_tier",
        "frozen_at",
        "created_at",
    ]
    list_filter = ["is_active", "trust_tier", "tenant"]
    search_fields = ["name"]
    list_select_related = ["tenant"]
    inlines = [AgentKeyInline]
    actions = ["issue_key", "freeze", "unfreeze"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["tenant", "name"]
        return [
            "tenant",
            "name",
            "is_active",
            "sponsor",
            "trust_tier",
            "tags",
            "frozen_at",
        ]

    def formfield_for_foreignkey(
        self, db_field: Any, request: HttpRequest, **kwargs: Any
    ) -> Any:
        """A sponsor is picked among the members of the person's tenants."""
        if db_field.name == "sponsor":
            kwargs["queryset"] = (
                get_user_model()
                .objects.filter(
                    memberships__tenant_id__in=tenant_ids(
                        request, TenantPerm.MANAGE_TENANT
                    )
                )
                .distinct()
                .order_by("username")
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [] if obj is None else ["tenant", "name", "frozen_at"]

    # The kill switch (docs/limits.md): every call refused from the commit on.
    @admin.action(
        description="Freeze: refuse every call, expire its leases",
        permissions=["manage"],
    )
    def freeze(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda agent: limits_services.agent_freeze(
                tenant=agent.tenant, agent_id=agent.pk, by=request.user
            ),
            "frozen",
        )

    @admin.action(description="Unfreeze", permissions=["manage"])
    def unfreeze(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda agent: limits_services.agent_freeze(
                tenant=agent.tenant, agent_id=agent.pk, by=request.user, frozen=False
            ),
            "unfrozen",
        )

    def save_model(
        self, request: HttpRequest, obj: Agent, form: Any, change: bool
    ) -> None:
        if change:
            services.agent_set_active(
                agent=Agent.objects.get(tenant_id=obj.tenant_id, pk=obj.pk),
                by=request.user,
                is_active=form.cleaned_data["is_active"],
            )
            sponsor = form.cleaned_data.get("sponsor")
            services.agent_set_sponsor(
                agent=Agent.objects.get(tenant_id=obj.tenant_id, pk=obj.pk),
                by=request.user,
                sponsor_id=sponsor.pk if sponsor is not None else None,
            )
            services.agent_set_policy_attributes(
                agent=Agent.objects.get(tenant_id=obj.tenant_id, pk=obj.pk),
                by=request.user,
                trust_tier=form.cleaned_data["trust_tier"],
                tags=form.cleaned_data.get("tags") or [],
            )
            return
        created = services.agent_create(
            tenant=form.cleaned_data["tenant"], by=request.user, name=obj.name
        )
        self.adopt(obj, created)

    @admin.action(
        description="Issue a new API key (shown once)", permissions=["manage"]
    )
    def issue_key(
        self, request: HttpRequest, queryset: QuerySet[Agent]
    ) -> TemplateResponse | None:
        if not self.spend_once(request):
            return None
        new_keys = []
        for agent in self.manageable(request, queryset).select_related("tenant"):
            issued = services.agent_key_issue(agent=agent, by=request.user)
            new_keys.append(
                NewKey(
                    agent=agent.name,
                    prefix=issued.key.prefix,
                    what=f"new key {issued.key.prefix}",
                    secret=issued.secret,
                )
            )
        return new_keys_page(self, request, new_keys)


class KeyActionForm(OnceActionForm):
    """The action bar, with the time that rotation and expiry take."""

    until = forms.DateTimeField(
        required=False,
        label="until (UTC)",
        help_text="Rotate: the old key works until then. Expire: the key stops then.",
        widget=forms.DateTimeInput(attrs={"placeholder": "YYYY-MM-DD HH:MM"}),
    )


@admin.register(AgentKey)
class AgentKeyAdmin(OnceActions):
    """API keys by prefix; the secret is never stored. Revoke, rotate or expire here."""

    view_perm = TenantPerm.MANAGE_TENANT
    manage_perm = TenantPerm.MANAGE_TENANT
    list_display = [
        "prefix",
        "agent",
        "tenant",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    ]
    list_filter = ["tenant"]
    search_fields = ["prefix", "agent__name"]
    list_select_related = ["tenant", "agent"]
    fields = (
        "prefix",
        "agent",
        "tenant",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    readonly_fields = fields
    action_form = KeyActionForm
    actions = ["revoke_keys", "rotate_keys", "expire_keys"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _until(self, request: HttpRequest) -> dt.datetime | None:
        """The action bar's time, read as UTC; None (and a message) if missing."""
        # The action bar's own form has the action choices only the changelist
        # knows; the time field is read on its own.
        try:
            until = KeyActionForm.base_fields["until"].clean(request.POST.get("until"))
        except forms.ValidationError:
            until = None
        if until is None:
            self.message_user(
                request, "Give the time in the 'until' field first.", messages.ERROR
            )
            return None
        if timezone.is_naive(until):
            until = timezone.make_aware(until, dt.UTC)
        return until

    @admin.action(
        description="Rotate: a new key now, the old one valid until the time given",
        permissions=["manage"],
    )
    def rotate_keys(
        self, request: HttpRequest, queryset: QuerySet[AgentKey]
    ) -> TemplateResponse | None:
        until = self._until(request)
        if until is None or not self.spend_once(request):
            return None
        new_keys = []
        rotating = self.manageable(request, queryset).select_related("tenant", "agent")
        for key in rotating:
            try:
                issued = services.agent_key_rotate(
                    key=key, by=request.user, old_valid_until=until
                )
            except PortalError as error:
                self.message_user(request, f"{key}: {error.detail}", messages.ERROR)
                continue
            new_keys.append(
                NewKey(
                    agent=key.agent.name,
                    prefix=issued.key.prefix,
                    what=f"new key {issued.key.prefix}, successor of {key.prefix} "
                    f"(which works until {until.isoformat()})",
                    secret=issued.secret,
                )
            )
        return new_keys_page(self, request, new_keys)

    @admin.action(
        description="Expire selected keys at the time given", permissions=["manage"]
    )
    def expire_keys(self, request: HttpRequest, queryset: QuerySet[AgentKey]) -> None:
        until = self._until(request)
        if until is None:
            return
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda key: services.agent_key_expire(
                key=key, by=request.user, expires_at=until
            ),
            f"expires at {until.isoformat()}",
        )

    @admin.action(description="Revoke selected keys", permissions=["manage"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[AgentKey]) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda key: services.agent_key_revoke(key=key, by=request.user),
            "revoked",
        )


class AgentGrantForm(forms.ModelForm):
    class Meta:
        model = AgentGrant
        fields = ["agent", "action", "target"]
        help_texts = {"target": "A connector target, or * for any target."}


@admin.register(AgentGrant)
class AgentGrantAdmin(TenantScopedAdmin):
    """What each agent may do: an action on a target. Revoking stops queued work."""

    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    form = AgentGrantForm
    list_display = ["agent", "action", "target", "tenant", "created_at"]
    list_filter = ["tenant", "action"]
    search_fields = ["agent__name", "action", "target"]
    list_select_related = ["tenant", "agent"]
    autocomplete_fields = ["agent"]
    actions = ["revoke_grants"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: AgentGrant, form: Any, change: bool
    ) -> None:
        grant = services.agent_grant_add(
            agent=form.cleaned_data["agent"],
            by=request.user,
            action=form.cleaned_data["action"],
            target=form.cleaned_data["target"],
        )
        self.adopt(obj, grant)

    @admin.action(description="Revoke selected grants", permissions=["manage"])
    def revoke_grants(
        self, request: HttpRequest, queryset: QuerySet[AgentGrant]
    ) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant", "agent"),
            lambda grant: services.agent_grant_revoke(grant=grant, by=request.user),
            "revoked",
        )


class MembershipForm(forms.ModelForm):
    """A person by username (accounts come from the platform operator) and a role."""

    username = forms.CharField(
        max_length=150,
        help_text=(
            "The person's portal username. They need an account first: accounts "
            "are made by the platform operator (Users → Add user in this admin; "
            "manage.py tenant_create for a tenant's first administrator), because "
            "one account may belong to several tenants. For a new colleague "
            "without an account, send an invitation instead (Invitations → Add): "
            "they choose their username and password from the e-mailed link."
        ),
    )

    class Meta:
        model = Membership
        fields = ["tenant", "role"]


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    """Who may do what in your tenant: reviewer, support or tenant administrator."""

    view_perm = TenantPerm.MANAGE_TENANT
    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    form = MembershipForm
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username"]
    list_select_related = ["tenant", "user"]
    actions = ["remove_members"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (
            ["tenant", "username", "role"]
            if obj is None
            else ["tenant", "user", "role"]
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [] if obj is None else ["tenant", "user"]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is not None:  # changing: the role only, without the username field
            kwargs["form"] = forms.ModelForm
        return super().get_form(request, obj, change, **kwargs)

    def save_model(
        self, request: HttpRequest, obj: Membership, form: Any, change: bool
    ) -> None:
        tenant = obj.tenant if change else form.cleaned_data["tenant"]
        username = obj.user.get_username() if change else form.cleaned_data["username"]
        membership = services.membership_set(
            tenant=tenant,
            by=request.user,
            username=username,
            role=Role(form.cleaned_data["role"]),
        )
        self.adopt(obj, membership)

    @admin.action(description="Remove selected members", permissions=["manage"])
    def remove_members(
        self, request: HttpRequest, queryset: QuerySet[Membership]
    ) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant", "user"),
            lambda member: services.membership_revoke(
                membership=member, by=request.user
            ),
            "removed",
        )


class InvitationForm(forms.ModelForm):
    class Meta:
        model = Invitation
        fields = ["tenant", "email", "role"]
        help_texts = {
            "email": (
                "The link goes to this address and works once, for 7 days. The "
                "person chooses a username and password there, or signs in with "
                "the account they have. Inviting an address again sends a new link "
                "and the older one stops working."
            ),
        }

    def clean_email(self) -> str:
        return str(self.cleaned_data["email"]).strip().lower()  # stored lower-cased


@admin.register(Invitation)
class InvitationAdmin(TenantScopedAdmin):
    """Invite a person by e-mail to a role (console/invitations.py)."""

    view_perm = TenantPerm.MANAGE_TENANT
    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    form = InvitationForm
    list_display = [
        "email",
        "tenant",
        "role",
        "invited_by",
        "created_at",
        "expires_at",
        "accepted_at",
        "accepted_by",
    ]
    list_filter = ["role", "tenant"]
    search_fields = ["email"]
    list_select_related = ["tenant", "invited_by", "accepted_by"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["tenant", "email", "role"]
        return self.list_display

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [] if obj is None else self.list_display

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a new invitation replaces an open one: invite again

    def save_model(
        self, request: HttpRequest, obj: Invitation, form: Any, change: bool
    ) -> None:
        issued = invitations.invitation_send(
            tenant=form.cleaned_data["tenant"],
            by=request.user,
            email=form.cleaned_data["email"],
            role=form.cleaned_data["role"],
        )
        self.adopt(obj, issued.invitation)
        self.message_user(
            request,
            f"Invitation e-mailed to {issued.invitation.email}"
            + (" (it replaces the earlier link)" if issued.replaced else "")
            + f"; the link works once, until "
            f"{issued.invitation.expires_at:%Y-%m-%d %H:%M} UTC.",
        )
