"""Every error answer under ``/api/`` is problem+json, whoever wrote it.

DRF's views already answer through ``portal.api.problem_exception_handler``. What
Django answers by itself does not go through it: the 404 of a path no route
matches (with ``DEBUG`` on, the technical HTML page), the 400 of a bad ``Host``,
a 500 outside a DRF view. This middleware, outermost, rewrites each such answer
into the problem document of its status and keeps its headers (``Allow``,
``WWW-Authenticate``, ``Retry-After``, ``traceparent``).

It also refuses, before any view or query runs, a path or query string that
carries a NUL character, which PostgreSQL cannot store or compare.

``ProblemGuard`` wraps the WSGI application itself (``config/wsgi.py``): it answers
what would break Django before its middleware runs, and rewrites an error answer
under ``/api/`` that some middleware outside ``ApiProblemMiddleware`` wrote (the
OpenTelemetry middleware, which Django's instrumentation puts first, reads the
``Host`` header: a host not in ``ALLOWED_HOSTS`` made Django's HTML 400 there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware import common
from django.utils.http import parse_header_parameters

from .problems import (
    PROBLEM_CONTENT_TYPE,
    encode,
    is_api_path,
    problem_body,
    status_problem,
)

_REPLACED_HEADERS = {"content-type", "content-length"}


def _has_nul(request: HttpRequest) -> bool:
    query = request.META.get("QUERY_STRING", "")
    return "\x00" in request.path_info or "\x00" in query or "%00" in query


def _trace_id(request: HttpRequest) -> str:
    trace = getattr(request, "portal_trace", None)
    return trace.trace_id if trace else ""


def _problem_response(
    body: dict[str, object], *, like: HttpResponseBase | None = None
) -> HttpResponse:
    content = encode(body)
    response = HttpResponse(
        content, status=int(str(body["status"])), content_type=PROBLEM_CONTENT_TYPE
    )
    if like is not None:
        for name, value in like.items():
            if name.lower() not in _REPLACED_HEADERS:
                response[name] = value
        response.cookies = like.cookies
    response["Content-Length"] = str(len(content))
    return response


class ApiProblemMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not is_api_path(request.path_info):
            return self.get_response(request)
        if _has_nul(request):
            return _problem_response(
                problem_body(
                    status=400,
                    code="MALFORMED_REQUEST",
                    detail="The path or query string contains a NUL character.",
                )
            )
        response = self.get_response(request)
        content_type = response.get("Content-Type", "")
        if response.status_code < 400 or content_type.startswith(PROBLEM_CONTENT_TYPE):
            return response
        return _problem_response(
            status_problem(response.status_code, trace_id=_trace_id(request)),
            like=response,
        )


class CommonMiddleware(common.CommonMiddleware):
    """Django's, without the slash redirect of an API request that has a body.

    ``APPEND_SLASH`` would answer ``POST /api/v1`` with a redirect that drops the
    body, and with ``DEBUG`` on with a ``RuntimeError`` (a 500). Such a request
    gets the 404 of a path no route matches instead.
    """

    def should_redirect_with_slash(self, request: HttpRequest) -> bool:
        if is_api_path(request.path_info) and request.method not in ("GET", "HEAD"):
            return False
        return bool(super().should_redirect_with_slash(request))


def _is_text_encoding(name: str) -> bool:
    try:
        "".encode(name)  # unlike codecs.lookup(), refuses bz2_codec and the like
    except (LookupError, UnicodeError):
        return False
    return True


class ProblemGuard:
    """WSGI middleware: refuses a request Django would fail on while building it,
    and keeps every error answer under ``/api/`` problem+json.

    A ``Content-Type`` charset naming a codec that is not a text encoding
    (``charset=bz2_codec``) made Django's request raise ``LookupError`` as soon as
    the query string was read, before any middleware: a 500 from gunicorn. It is
    a 415 here, on every path.

    An error answer under ``/api/`` that is not problem+json (written outside
    ``ApiProblemMiddleware``) is replaced by the problem document of its status,
    keeping its other headers, as that middleware does.
    """

    def __init__(self, application: Callable[..., Iterable[bytes]]) -> None:
        self.application = application

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        _, params = parse_header_parameters(environ.get("CONTENT_TYPE", ""))
        charset = params.get("charset")
        if charset is not None and not _is_text_encoding(charset):
            body = encode(
                problem_body(
                    status=415,
                    code="UNSUPPORTED_MEDIA_TYPE",
                    detail=f"The charset {charset[:40]!r} is not a text encoding.",
                )
            )
            start_response(
                "415 Unsupported Media Type",
                [
                    ("Content-Type", PROBLEM_CONTENT_TYPE),
                    ("Content-Length", str(len(body))),
                ],
            )
            return [body]
        if not is_api_path(environ.get("PATH_INFO", "")):
            return self.application(environ, start_response)
        refused: list[tuple[int, list[tuple[str, str]]]] = []

        def keep_or_hold(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            code = int(status.split(" ", 1)[0])
            content_type = next(
                (v for k, v in headers if k.lower() == "content-type"), ""
            )
            if code >= 400 and not content_type.startswith(PROBLEM_CONTENT_TYPE):
                refused.append((code, headers))
                return lambda data: None
            return start_response(status, headers, exc_info)

        answer = self.application(environ, keep_or_hold)
        if not refused:
            return answer
        if hasattr(answer, "close"):
            answer.close()  # Django's request_finished: the connection goes back
        status, headers = refused[-1]
        body = encode(status_problem(status))
        kept = [(k, v) for k, v in headers if k.lower() not in _REPLACED_HEADERS]
        start_response(
            f"{status} {HTTPStatus(status).phrase}",
            [
                *kept,
                ("Content-Type", PROBLEM_CONTENT_TYPE),
                ("Content-Length", str(len(body))),
            ],
        )
        return [body]
