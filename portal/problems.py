"""RFC 9457 problem details: the one shape of every error answer under ``/api/``.

Plain Python on purpose (no Django, no DRF): the DRF exception handler
(``portal.api``), the middleware that catches what Django answers itself
(``portal.middleware``) and the gunicorn worker that answers before Django runs
(``config.gunicorn_worker``) all build their bodies here.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

PROBLEM_CONTENT_TYPE = "application/problem+json"
API_PREFIX = "/api/"

# The code of an error that only has an HTTP status: what Django, DRF or the HTTP
# server refused before a view could say more (docs/api.md, "Errors").
STATUS_CODES: dict[int, tuple[str, str]] = {
    400: ("MALFORMED_REQUEST", "The request is malformed."),
    401: ("UNAUTHENTICATED", "Authentication is required."),
    403: ("FORBIDDEN", "You may not do this."),
    404: ("NOT_FOUND", "No such endpoint."),
    405: ("METHOD_NOT_ALLOWED", "This endpoint does not take that method."),
    406: ("NOT_ACCEPTABLE", "No representation matches the Accept header."),
    413: ("REQUEST_TOO_LARGE", "The request body is too large."),
    414: ("URI_TOO_LONG", "The request line is too long."),
    415: ("UNSUPPORTED_MEDIA_TYPE", "Send the body as application/json."),
    417: ("EXPECTATION_FAILED", "The Expect header cannot be met."),
    431: ("HEADERS_TOO_LARGE", "A request header, or all of them, is too large."),
    500: ("INTERNAL", "Unexpected error."),
    501: ("NOT_IMPLEMENTED", "The server does not support that."),
}


def is_api_path(path: str) -> bool:
    """Whether answers to ``path`` must be problem+json when they are errors."""
    return path == API_PREFIX.rstrip("/") or path.startswith(API_PREFIX)


def problem_body(
    *, status: int, code: str, detail: str, trace_id: str = "", **members: Any
) -> dict[str, Any]:
    """The problem document, with the portal's ``code`` and ``trace_id`` members."""
    return {
        "type": f"https://agent-governance-portal.invalid/problems/{code.lower()}",
        "title": code.replace("_", " ").capitalize(),
        "status": status,
        "detail": detail,
        "code": code,
        "trace_id": trace_id,
        **members,
    }


def status_problem(status: int, *, trace_id: str = "") -> dict[str, Any]:
    """The problem document of an error known only by its HTTP status."""
    if status in STATUS_CODES:
        code, detail = STATUS_CODES[status]
    elif status >= 500:
        code, detail = STATUS_CODES[500]
    else:
        code = "REQUEST_REFUSED"
        try:
            detail = f"{HTTPStatus(status).phrase}."
        except ValueError:
            detail = "The request was refused."
    return problem_body(status=status, code=code, detail=detail, trace_id=trace_id)


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
