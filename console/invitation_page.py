"""The page an invitation's link opens (``/invite/<token>``; console/invitations.py).

Anyone holding the link may open it, signed in or not. An unknown or altered token
answers 404, a used, expired or withdrawn invitation 410, each with a page that
says what to do; nothing is written then. An open invitation shows the tenant and
the role, and offers to accept as the signed-in person, or to make an account
(username and password, checked by Django's password validators), or to sign in
first through the admin's own login (its lockout included), which comes back here.
On acceptance the person is signed in (a new account) and lands on the portal.

The link's token is in the path: the page answers with ``Referrer-Policy:
same-origin`` (no other site gets the address as a referrer; ``no-referrer`` would
make Chromium send ``Origin: null`` with the page's own form, which Django's CSRF
check refuses) and is never cached.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import login
from django.contrib.auth.forms import UserCreationForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from portal import scope
from portal import selectors as portal_selectors
from portal.exceptions import PortalError, ValidationFailed
from portal.models import Role

from . import invitations
from .exceptions import (
    InvitationExpired,
    InvitationNotFound,
    InvitationUsed,
)

# A new account signs in with the password it chose, through Django's backend.
_BACKEND = "django.contrib.auth.backends.ModelBackend"


class AccountForm(UserCreationForm):
    """Username and password twice; the password validators of the settings."""

    class Meta(UserCreationForm.Meta):  # type: ignore[name-defined]
        fields = ("username",)


def _page(
    request: HttpRequest, status: int, context: dict[str, Any]
) -> TemplateResponse:
    response = TemplateResponse(
        request,
        "console/invitation.html",
        {**admin.site.each_context(request), **context},
        status=status,
    )
    response["Referrer-Policy"] = "same-origin"
    return response


def _refused(request: HttpRequest, error: PortalError) -> TemplateResponse:
    return _page(
        request,
        error.status,
        {"title": "Invitation", "refusal": error.detail, "code": error.code},
    )


@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def invitation_view(request: HttpRequest, token: str) -> HttpResponse:
    """Show the invitation, or take it up (POST ``accept`` or ``create``)."""
    tenant_ids = portal_selectors.invitation_tenant_ids(token=token)
    check = None
    if tenant_ids:
        with scope.tenant_scope(tenant_ids):
            check = portal_selectors.invitation_check(token=token)
    if check is None:
        return _refused(request, InvitationNotFound())
    if check.status == "used":
        return _refused(request, InvitationUsed())
    if check.status == "expired":
        return _refused(request, InvitationExpired())
    form = AccountForm(prefix="new")
    if request.method == "POST":
        account = None
        if request.POST.get("action") == "create":
            form = AccountForm(request.POST, prefix="new")
            if form.is_valid():
                account = invitations.NewAccount(
                    username=form.cleaned_data["username"],
                    password=form.cleaned_data["password1"],
                )
        if account is not None or (
            request.POST.get("action") == "accept" and request.user.is_authenticated
        ):
            try:
                accepted = invitations.invitation_accept(
                    token=token, user=request.user, account=account
                )
            except ValidationFailed as error:
                form.add_error(
                    "username" if error.context.get("field") else None, error.detail
                )
            except PortalError as error:
                return _refused(request, error)
            else:
                if account is not None:
                    login(request, accepted.user, backend=_BACKEND)
                tenant = accepted.membership.tenant
                role = Role(accepted.membership.role).label
                messages.success(
                    request,
                    f"Welcome to {tenant.name}: you are a member as {role}."
                    if accepted.granted
                    else f"You were a member of {tenant.name} already, as {role}; "
                    "your role is unchanged.",
                )
                return HttpResponseRedirect(reverse("admin:index"))
    invitation = check.invitation
    return _page(
        request,
        400 if form.errors else 200,
        {
            "title": f"Join {invitation.tenant.name}",
            "invitation": invitation,
            "role": Role(invitation.role).label,
            "form": form,
            "login_url": reverse("admin:login")
            + "?"
            + urlencode({"next": request.path}),
        },
    )
