"""The Content-Security-Policy header on every answer (docs/portal.md).

django-csp's middleware, with one change: an answer that is not an HTML page (the
API's JSON and problem+json, /metrics, the probes, a static file) gets
``PORTAL_CSP_NOT_HTML`` (load nothing, be framed nowhere) instead of the pages'
``CONTENT_SECURITY_POLICY``. A view that sets its own policy with django-csp's
decorators keeps it.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase


def _is_html(response: HttpResponseBase) -> bool:
    return response.get("Content-Type", "").startswith("text/html")


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    def get_policy_parts(
        self,
        request: HttpRequest,
        response: HttpResponseBase,
        report_only: bool = False,
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only and parts.config is None and not _is_html(response):
            parts.config = settings.PORTAL_CSP_NOT_HTML
        return parts
