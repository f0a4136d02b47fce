"""The operator's page that makes a tenant and invites its first administrator
(``/admin/tenants/new/``; console/tenants.py, docs/portal.md "A new tenant").

One form: the tenant's slug and name, what happens to its events if it is deleted,
and the administrator's e-mail address. Only the platform operator (a superuser)
gets the page; anyone else, a tenant administrator included, gets 403, a POST too.
A bad or taken slug, a name a live tenant has or a bad address is said on its
field (400) and nothing is written. On success the tenant, its ``tenant.created``
event and the invitation commit together, the e-mail goes out after the commit,
and the operator lands on the new tenant's page with what was done (or, if the
mail server refused, that the invitation is stored and how to send it again).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from portal.exceptions import ValidationFailed
from portal.models import EventsOnDelete

from . import tenants
from .exceptions import InvitationNotSent

TITLE = "New tenant"


class TenantNewForm(forms.Form):
    slug = forms.SlugField(
        max_length=tenants.SLUG_MAX,
        help_text="Short name in URLs and commands: letters, digits, - and _. "
        "It cannot be changed later.",
    )
    name = forms.CharField(
        max_length=tenants.NAME_MAX,
        help_text="The tenant's full name, as people see it.",
    )
    events_on_delete = forms.ChoiceField(
        label="Events when deleted",
        choices=EventsOnDelete.choices,
        initial=EventsOnDelete.KEEP,
        help_text="What happens to its audit trail if the tenant is ever deleted "
        "(docs/tenant-deletion.md); only the operator changes it later.",
    )
    admin_email = forms.EmailField(
        label="Administrator's e-mail",
        help_text="Gets an invitation to be the tenant's administrator; they choose "
        "their username and password on the link's page (valid for 7 days).",
    )


def tenant_new_view(request: HttpRequest) -> HttpResponse:
    """The form (GET), or make the tenant and invite its administrator (POST)."""
    if not tenants.is_operator(request.user):
        raise PermissionDenied  # Django's 403 page
    form = TenantNewForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            made = tenants.tenant_invite_admin_send(
                by=request.user,
                slug=data["slug"],
                name=data["name"],
                email=data["admin_email"],
                events_on_delete=data["events_on_delete"],
            )
        except ValidationFailed as error:
            field = {"email": "admin_email"}.get(
                error.context.get("field", ""), error.context.get("field")
            )
            form.add_error(field if field in form.fields else None, error.detail)
        except InvitationNotSent as error:
            messages.warning(
                request,
                f"Tenant {data['slug']!r} ({data['name']}) is made and the "
                "invitation is stored, but its e-mail could not be sent "
                f"({error.context.get('error')}). Invite the address again from "
                "Invitations → Add to send a new link.",
            )
            return HttpResponseRedirect(reverse("admin:portal_tenant_changelist"))
        else:
            invitation = made.issued.invitation
            messages.success(
                request,
                f"Tenant {made.tenant.slug!r} ({made.tenant.name}) is made. An "
                "invitation to be its administrator was e-mailed to "
                f"{invitation.email}; the link works once, until "
                f"{invitation.expires_at:%Y-%m-%d %H:%M} UTC.",
            )
            return HttpResponseRedirect(
                reverse("admin:portal_tenant_change", args=[made.tenant.pk])
            )
    context: dict[str, Any] = {
        **admin.site.each_context(request),
        "title": TITLE,
        "form": form,
    }
    return TemplateResponse(
        request,
        "admin/console/tenant_new.html",
        context,
        status=400 if form.errors else 200,
    )
