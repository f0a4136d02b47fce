"""django-axes' two hooks for the admin's login (settings ``AXES_*``; docs/portal.md).

``client_ip`` says which address a failed login counts against; ``lockout_response``
is the page a locked-out login gets: HTTP 429 in the admin's frame, saying for how
long and who can unlock it sooner, never a 500 or a bare line of text.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def client_ip(request: HttpRequest) -> str | None:
    """The client's address: the peer's, or the one the outermost of
    ``PORTAL_TRUSTED_PROXIES`` proxies appended to X-Forwarded-For.

    Each trusted proxy appends the address it was connected from, so the client's
    is that many places from the right; whatever stands left of it the client wrote
    itself and is not believed.
    """
    proxies = settings.PORTAL_TRUSTED_PROXIES
    peer = request.META.get("REMOTE_ADDR")
    if not proxies:
        return peer
    forwarded = [
        hop.strip()
        for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
        if hop.strip()
    ]
    return forwarded[-proxies] if len(forwarded) >= proxies else peer


def lockout_response(
    request: HttpRequest,
    original_response: HttpResponse | None,
    credentials: dict[str, Any] | None,
) -> HttpResponse:
    """The locked-out page (429), with the cool-off in minutes."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    context = {
        **admin.site.each_context(request),
        "title": "Too many failed logins",
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "cooloff_minutes": minutes,
    }
    return render(
        request, "admin/lockout.html", context, status=HTTPStatus.TOO_MANY_REQUESTS
    )
