"""API wiring shared by every endpoint: agent base view, errors, idempotency, traces.

``AgentApi`` authenticates the Bearer key, takes the tenant from it (never from the
body or URL), throttles per agent, parses ``traceparent``, and applies the
``Idempotency-Key`` header to POSTs. Every error leaves as RFC 9457
``application/problem+json`` with a stable ``code``; nothing escapes as a bare 500.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, TypeVar

from django.core import exceptions as django_exceptions
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    QueryDict,
    UnreadablePostError,
)
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions as drf_exceptions
from rest_framework import serializers
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    get_authorization_header,
)
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from . import api_input, idempotency, logs, scope, selectors
from .actors import Actor
from .exceptions import (
    AgentFrozen,
    AuthFailuresThrottled,
    DatabaseBusy,
    DatabaseUnavailable,
    MalformedRequest,
    PortalError,
    RateLimited,
    TenantFrozen,
    ValidationFailed,
)
from .models import Agent, AgentKey, AuthFailureWindow, Tenant
from .problems import PROBLEM_CONTENT_TYPE, encode, problem_body
from .tracing import Trace, traceparent_of

logger = logging.getLogger(__name__)

REPLAY_HEADER = "Idempotent-Replayed"
LEASE_TOKEN_HEADER = "Lease-Token"  # noqa: S105  (a header name, not a secret)

S = TypeVar("S", bound=serializers.Serializer)


# --- Authentication, permission, throttling ------------------------------------------


class KnownKeyRefused(drf_exceptions.AuthenticationFailed):
    """The exact secret of a real key that no longer authenticates: its tenant
    hears of it (an ``agent_key.refused`` event, written by ``limits.api``)."""

    def __init__(self, *, key: AgentKey | None = None) -> None:
        super().__init__()
        self.key = key
        self.recorded = False


class ApiKeyExpired(KnownKeyRefused):
    default_detail = "This API key has expired; use the key that replaced it."


class ApiKeyRevoked(KnownKeyRefused):
    default_detail = "This API key was revoked."


def caller_refuse_frozen(*, agent: Agent) -> None:
    """Refuse a frozen agent, or an agent of a frozen tenant (docs/limits.md).

    Reads the flags the key lookup loaded (``selectors.agent_key_authenticate``, in
    its one statement): no cache can hide a freeze. Records nothing; the door that
    answers writes the denial (``limits.api``, the MCP server's ``auth.caller``).

    Raises:
        AgentFrozen: the agent is frozen.
        TenantFrozen: its tenant is frozen.
    """
    if agent.frozen_at is not None:
        raise AgentFrozen(tenant_id=agent.tenant_id, agent_id=str(agent.pk))
    if agent.tenant.frozen_at is not None:
        raise TenantFrozen(tenant_id=agent.tenant_id, agent_id=str(agent.pk))


# Failed authentications, counted per source address and per key prefix in one
# statement on the database clock (fixed windows, like the agent's request rate).
_AUTH_FAILURE_WINDOW = f"""
INSERT INTO {AuthFailureWindow._meta.db_table} AS w (bucket, window_start, failures)
SELECT bucket,
    to_timestamp(floor(extract(epoch FROM app_now()) / %(window_s)s) * %(window_s)s),
    1
FROM unnest(%(buckets)s::text[]) AS bucket
ON CONFLICT (bucket) DO UPDATE SET
    failures = CASE WHEN w.window_start = EXCLUDED.window_start
                    THEN w.failures + 1 ELSE 1 END,
    window_start = EXCLUDED.window_start
RETURNING w.bucket, w.failures,
    extract(epoch FROM w.window_start + make_interval(secs => %(window_s)s) - app_now())
"""
# Buckets over their limit, as this process last counted them: bucket -> monotonic
# end of the block. Checked before any query, so a burst from a blocked source
# costs no database work here until its window ends.
_blocked: dict[str, float] = {}


def _auth_failure_rate() -> tuple[int, int] | None:
    rate = api_settings.DEFAULT_THROTTLE_RATES.get("auth_failure")
    if not rate:
        return None
    count, _, period = str(rate).partition("/")
    return int(count), {"s": 1, "m": 60, "h": 3600, "d": 86400}[period[0]]


def auth_failure_buckets(*, address: str, secret: str) -> list[str]:
    """The throttle's buckets of a request: its source address, and the key prefix
    it names if it has the shape of one (a prefix names a key, it opens nothing)."""
    buckets = [f"addr:{address[:90]}"]
    prefix, dot, _ = secret.partition(".")
    if dot and 0 < len(prefix) <= 16 and prefix.isascii() and prefix.isprintable():
        buckets.append(f"prefix:{prefix}")
    return buckets


def auth_failure_refuse_blocked(buckets: list[str]) -> None:
    """Raises AuthFailuresThrottled while this process knows the request's source
    address is blocked: before any query, whatever key it sends."""
    now = time.monotonic()
    for bucket in buckets:
        until = _blocked.get(bucket)
        if until is not None:
            if until > now:
                wait_s = max(1, math.ceil(until - now))
                raise AuthFailuresThrottled(retry_after_s=wait_s)
            _blocked.pop(bucket, None)


def auth_failure_record(*, buckets: list[str], reason: str) -> None:
    """Count a failed authentication and log it (address and prefix, never the
    secret). Raises AuthFailuresThrottled when a bucket went over its limit.

    An address over the limit is blocked in this process until its window ends. A
    prefix over the limit only turns its failures into 429s: blocking it would let
    anyone who knows a key's prefix lock its agent out.
    """
    logger.warning(
        "API authentication failed",
        extra={"buckets": ",".join(buckets), "reason": reason},
    )
    rate = _auth_failure_rate()
    if rate is None:
        return
    limit, window_s = rate
    with connection.cursor() as cursor:
        cursor.execute(_AUTH_FAILURE_WINDOW, {"buckets": buckets, "window_s": window_s})
        counted = {str(row[0]): (int(row[1]), float(row[2])) for row in cursor}
    over = {b: left for b, (failures, left) in counted.items() if failures > limit}
    if not over:
        return
    wait_s = max(1, math.ceil(max(over.values())))
    for bucket, left in over.items():
        if bucket.startswith("addr:"):
            _blocked[bucket] = time.monotonic() + left
    raise AuthFailuresThrottled(retry_after_s=wait_s)


class AgentKeyAuthentication(BaseAuthentication):
    """``Authorization: Bearer <agent key>``; the key fixes agent and tenant.

    Failed attempts are counted per source address and per key prefix
    (``PORTAL_AUTH_FAILURE_LIMIT``, default 20 a minute each); past the limit a
    failure is ``429 RATE_LIMITED`` with ``Retry-After``, and the address is
    refused until its window ends, a right key included (docs/limits.md).
    """

    def authenticate(
        self, request: Request
    ) -> tuple[Agent, selectors.RateWindow | None] | None:
        header = get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        buckets = auth_failure_buckets(
            address=request.META.get("REMOTE_ADDR", ""),
            secret=header.partition(" ")[2].strip(),
        )
        auth_failure_refuse_blocked(buckets)
        try:
            return self._authenticate(request, header)
        except drf_exceptions.AuthenticationFailed as failed:
            auth_failure_record(buckets=buckets, reason=type(failed).__name__)
            raise

    def _authenticate(
        self, request: Request, header: str
    ) -> tuple[Agent, selectors.RateWindow | None]:
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise drf_exceptions.AuthenticationFailed(
                "Use 'Authorization: Bearer <key>'."
            )
        # The lookup also counts the request for the view's AgentRateThrottle, in
        # the same round trip (the throttle reads the count from ``request.auth``),
        # and writes the key's last-used mark when it is due.
        view = (request.parser_context or {}).get("view")
        check = selectors.agent_key_authenticate(
            secret=secret.strip(),
            count_in_window_s=AgentRateThrottle.window_s_of(view),
            mark_used=True,
        )
        if check is None:
            raise drf_exceptions.AuthenticationFailed("Invalid or revoked API key.")
        if check.status == "revoked":
            raise ApiKeyRevoked(key=check.key)
        if check.status == "expired":
            raise ApiKeyExpired(key=check.key)
        # The request's tenant scope (row-level security) until it ends.
        agent = check.key.agent
        scope.enter([agent.tenant_id])
        # A valid key, so 403, not 401; the denial is recorded by the exception
        # handler (limits.api). The lookup marked the key used if it is not frozen.
        caller_refuse_frozen(agent=agent)
        return agent, check.window

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="agent-api"'


class AgentKeyScheme(OpenApiAuthenticationExtension):
    target_class = "portal.api.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "Agent API key"}


class IsAgent(BasePermission):
    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.user, Agent)


class AgentRateThrottle(SimpleRateThrottle):
    """Per-agent request rate (``PORTAL_AGENT_RATE_LIMIT``); 429 with Retry-After.

    Counted in PostgreSQL (``AgentRequestWindow``), a fixed window on the database
    clock, shared by every process: with the limit N, exactly N requests of a window
    pass however many gunicorn workers serve them (docs/limits.md). The count is
    made by ``AgentKeyAuthentication``'s key lookup, in its one statement
    (``selectors.agent_key_authenticate``); this throttle decides by it.
    """

    scope = "agent"
    wait_s: float | None = None

    @classmethod
    def window_s_of(cls, view: APIView | None) -> int | None:
        """The window, in seconds, to count a request to ``view`` in; None when the
        view does not throttle with this class or no rate is set."""
        if view is None or cls not in getattr(view, "throttle_classes", ()):
            return None
        throttle = cls()
        return throttle.parse_rate(throttle.rate)[1]

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        return None  # no cache: the counter is in PostgreSQL

    def allow_request(self, request: Request, view: APIView) -> bool:
        if self.rate is None or not isinstance(request.user, Agent):
            return True
        window = request.auth
        if not isinstance(window, selectors.RateWindow):
            raise TypeError(
                "AgentRateThrottle decides by the count AgentKeyAuthentication "
                "makes; this agent was authenticated by something else."
            )
        self.wait_s = window.left_s
        return window.requests <= self.num_requests

    def wait(self) -> float | None:
        return self.wait_s


# --- Problem details -----------------------------------------------------------------

# Retry-After of a lost database connection: a restart or failover takes seconds.
DATABASE_RETRY_AFTER_S = 1
_SHUTDOWN = frozenset({"57P01", "57P02", "57P03"})


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the database connection is gone (a terminated session,
    a restart, no server to connect to), not that a statement was refused: Django
    drops the broken connection and opens a new one for the next request."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    # No SQLSTATE: the client library lost the server (closed, refused, timed out).
    # Class 08 is a connection exception; 57P01..57P03 the server shutting down.
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in _SHUTDOWN


# SQLSTATEs of a statement the server gave up on, its transaction rolled back and
# the connection fine: lock_not_available (lock_timeout), query_canceled
# (statement_timeout), deadlock_detected, serialization_failure.
_GAVE_UP = frozenset({"55P03", "57014", "40P01", "40001"})


def statement_gave_up(exc: BaseException) -> bool:
    """Whether ``exc`` is the server giving up on a statement for a reason a retry
    may not meet (a timeout, a deadlock): a retryable 503, not a 500."""
    if not isinstance(exc, OperationalError):
        return False
    return getattr(exc.__cause__, "sqlstate", None) in _GAVE_UP


def database_unavailable(request: Any = None) -> HttpResponse:
    """The retryable 503 of a lost database connection, for an answer made outside
    DRF's handler (a middleware that met the loss before the view)."""
    error = DatabaseUnavailable(retry_after_s=DATABASE_RETRY_AFTER_S)
    response = problem(
        status=error.status, code=str(error.code), detail=error.detail, request=request
    )
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    return response


_DRF_CODES: dict[type[drf_exceptions.APIException], tuple[str, str]] = {
    drf_exceptions.ParseError: (
        "MALFORMED_REQUEST",
        "The request body is not valid JSON.",
    ),
    drf_exceptions.NotAuthenticated: ("UNAUTHENTICATED", "Authentication is required."),
    drf_exceptions.AuthenticationFailed: ("UNAUTHENTICATED", ""),
    ApiKeyExpired: ("API_KEY_EXPIRED", ""),
    ApiKeyRevoked: ("API_KEY_REVOKED", ""),
    drf_exceptions.PermissionDenied: ("FORBIDDEN", ""),
    drf_exceptions.NotFound: ("NOT_FOUND", "No such object."),
    drf_exceptions.MethodNotAllowed: ("METHOD_NOT_ALLOWED", ""),
    drf_exceptions.NotAcceptable: ("NOT_ACCEPTABLE", ""),
    drf_exceptions.UnsupportedMediaType: ("UNSUPPORTED_MEDIA_TYPE", ""),
}


def _trace_id(request: Any) -> str:
    trace = getattr(request, "portal_trace", None)
    return trace.trace_id if trace else ""


def problem(
    *, status: int, code: str, detail: str, request: Any = None, **members: Any
) -> HttpResponse:
    """An RFC 9457 problem response with the portal's extension members.

    JSON whatever renderer the view negotiated: the schema and docs views render
    YAML and HTML, their errors do not.
    """
    body = problem_body(
        status=status,
        code=code,
        detail=detail,
        trace_id=_trace_id(request),
        **members,
    )
    return HttpResponse(encode(body), status=status, content_type=PROBLEM_CONTENT_TYPE)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse:
    """DRF's exception handler: every error becomes problem+json with a stable code."""
    request = context.get("request")
    if isinstance(exc, idempotency.IdempotentReplay):
        stored = exc.response
        response = HttpResponse(
            stored.body, status=stored.status, content_type=stored.content_type
        )
        response[REPLAY_HEADER] = "true"
        return response
    if isinstance(exc, DatabaseError) and connection_lost(exc):
        exc = DatabaseUnavailable(retry_after_s=DATABASE_RETRY_AFTER_S)
    elif isinstance(exc, DatabaseError) and statement_gave_up(exc):
        exc = DatabaseBusy(retry_after_s=DATABASE_RETRY_AFTER_S)
    if isinstance(exc, PortalError):
        response = problem(
            status=exc.status,
            code=str(exc.code),
            detail=exc.detail,
            request=request,
            **_json_safe(exc.context),
        )
        if isinstance(exc.context.get("retry_after_s"), int):
            response["Retry-After"] = str(exc.context["retry_after_s"])
        return response
    if isinstance(exc, drf_exceptions.ValidationError):
        return problem(
            status=400,
            code=ValidationFailed.code,
            detail="The request is not valid.",
            request=request,
            errors=_json_safe(exc.detail),
        )
    if isinstance(exc, drf_exceptions.Throttled):
        response = problem(
            status=429,
            code=RateLimited.code,
            detail=str(RateLimited().detail),
            request=request,
            retry_after_s=getattr(exc, "wait", None),
        )
        response["Retry-After"] = str(max(1, int(getattr(exc, "wait", None) or 1)))
        return response
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    if isinstance(exc, django_exceptions.PermissionDenied):
        exc = drf_exceptions.PermissionDenied()
    if isinstance(exc, django_exceptions.RequestDataTooBig):
        return problem(
            status=413,
            code="REQUEST_TOO_LARGE",
            detail="The request body is too large.",
            request=request,
        )
    if isinstance(
        exc,
        django_exceptions.SuspiciousOperation
        | django_exceptions.BadRequest
        | UnreadablePostError,
    ):
        # Django's refusals of the request itself (too many query fields, a body
        # that broke off): the client's fault, never a 500.
        return problem(
            status=400,
            code=MalformedRequest.code,
            detail=MalformedRequest().detail,
            request=request,
        )
    if isinstance(exc, drf_exceptions.APIException):
        code, detail = _DRF_CODES.get(type(exc), ("REQUEST_REFUSED", ""))
        response = problem(
            status=exc.status_code,
            code=code,
            detail=detail or str(exc.detail),
            request=request,
        )
        if isinstance(
            exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed
        ):
            response["WWW-Authenticate"] = 'Bearer realm="agent-api"'
        return response
    correlation_id = secrets.token_hex(8)
    logger.exception(
        "unhandled API error, correlation id %s",
        correlation_id,
        # Its own field too: JSON logs keep ids there, redact high-entropy text.
        extra={"correlation_id": correlation_id},
    )
    return problem(
        status=500,
        code="INTERNAL",
        request=request,
        correlation_id=correlation_id,
        detail="Unexpected error; quote the correlation id when reporting it.",
    )


# --- The agent base view -------------------------------------------------------------


def reject_unstorable_text(value: Any, path: str = "") -> None:
    """Refuse text PostgreSQL cannot store: NUL characters and lone surrogates.

    JSON allows both (``"\\u0000"``, ``"\\ud800"``); refusing them here turns what
    would be a database error into a 400 that names the field.

    Raises:
        ValidationFailed: with the JSON path of the first offending string or key.
    """
    if isinstance(value, str):
        if "\x00" in value:
            raise ValidationFailed("Text may not contain NUL characters.", field=path)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationFailed(
                "Text must be valid Unicode (no lone surrogates).", field=path
            ) from None
    elif isinstance(value, dict) or hasattr(value, "lists"):
        items = value.lists() if hasattr(value, "lists") else value.items()
        for key, item in items:
            reject_unstorable_text(key, path)
            reject_unstorable_text(item, f"{path}/{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            reject_unstorable_text(item, f"{path}/{index}")


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem details, with the portal's ``code`` and ``trace_id``."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    code = serializers.CharField(help_text="Stable machine-readable code.")
    trace_id = serializers.CharField()
    # Schema only (never used to validate), so shadowing Serializer.errors is harmless.
    errors = serializers.DictField(  # type: ignore[assignment]
        required=False, help_text="Field -> messages."
    )


def problem_responses(*statuses: int, post: bool = False) -> dict[tuple[int, str], Any]:
    """drf-spectacular ``responses`` entries for the problem answers of an endpoint.

    Every endpoint can answer 400, 401, 403 (a frozen agent or tenant,
    docs/limits.md) and 429; a POST also 409 (its Idempotency-Key is in flight) and
    422 (the key belongs to another request). Pass the others.
    """
    always = {400, 401, 403, 429} | ({409, 422} if post else set())
    return {
        (status, PROBLEM_CONTENT_TYPE): ProblemSerializer
        for status in sorted(always | set(statuses))
    }


class PortalApi(APIView):
    """What every endpoint shares: traces, validation, and no queries in views.

    ``get_queryset``/``get_object`` are refused at class creation, so every read
    goes through a selector that requires the tenant (docs/style.md R11).
    """

    trace: Trace
    # The portal never answers TRACE (it would echo credentials back). Leaving it
    # out also keeps dispatch from calling ``self.trace``, the request's trace
    # context, as if it were the TRACE handler; ``Allow`` lists what remains.
    http_method_names = [m for m in APIView.http_method_names if m != "trace"]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("get_queryset", "get_object", "queryset"):
            if name in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__}.{name}: API views hold no queries; call a "
                    "selector with the tenant instead (docs/style.md R11)."
                )

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        # Log lines written while serving name the task or operation of the URL.
        with logs.bind(
            task_id=kwargs.get("task_id"), operation_id=kwargs.get("operation_id")
        ):
            return super().dispatch(request, *args, **kwargs)

    def initialize_request(
        self, request: HttpRequest, *args: Any, **kwargs: Any
    ) -> Request:
        # Read before authentication so even a 401 carries the caller's trace id:
        # the server span the Django instrumentation started under the caller's
        # ``traceparent`` (portal/telemetry.py).
        self.trace = Trace.current()
        if not self.trace.trace_id:
            # No tracer provider in this process: the caller's trace, parsed by the
            # W3C propagator, and a span id of our own.
            trace = Trace.from_traceparent(request.headers.get("traceparent"))
            self.trace = Trace(trace_id=trace.trace_id, span_id=secrets.token_hex(8))
        request.portal_trace = self.trace  # type: ignore[attr-defined]
        return super().initialize_request(request, *args, **kwargs)

    def validated(self, serializer_class: type[S], data: Any) -> dict[str, Any]:
        """Validate input with a plain serializer; raise 400 VALIDATION_FAILED.

        A query string is validated as a plain dict, so an empty value is checked
        like any other instead of counting as absent (``api_input.query_data``).
        """
        if isinstance(data, QueryDict):
            data = api_input.query_data(data)
        reject_unstorable_text(data)
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)


# Named points on the way out of an agent's POST that carries an Idempotency-Key
# (docs/style.md R18): the service's transaction has committed and the answer is not
# stored yet ("before_answer_stored"), or stored and not sent yet
# ("after_answer_stored"). The fault tier's server replaces ``fault_hook`` to fail,
# cut or kill the request there (tests/fault/fault_wsgi.py); otherwise it does nothing.
FAULT_POINTS: Final = ("before_answer_stored", "after_answer_stored")


def _no_fault(point: str) -> None:
    return None


fault_hook: Callable[[str], None] = _no_fault


class AgentApi(PortalApi):
    """Base of every agent endpoint. Subclasses call one service and serialise."""

    authentication_classes = [AgentKeyAuthentication]
    permission_classes = [IsAgent]
    throttle_classes = [AgentRateThrottle]

    agent: Agent
    tenant: Tenant
    actor: Actor
    _idempotency_record: uuid.UUID | None = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(
            request, *args, **kwargs
        )  # authentication, permission, throttle
        assert isinstance(request.user, Agent)
        self.agent = request.user
        self.tenant = request.user.tenant
        self.actor = Actor.of_agent(self.agent)
        if request.method == "POST":
            key = request.headers.get("Idempotency-Key")
            if key is not None:
                fingerprint = idempotency.request_fingerprint(
                    method=request.method,
                    path=request.get_full_path(),
                    body=request._request.body,
                    lease_token=request.headers.get(LEASE_TOKEN_HEADER, ""),
                )
                self._idempotency_record = idempotency.idempotent_request_begin(
                    agent=self.agent,
                    key=idempotency.validate_key(key),
                    fingerprint=fingerprint,
                )

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        if getattr(self, "trace", None) and self.trace.trace_id:
            response["traceparent"] = traceparent_of(self.trace)
        record, self._idempotency_record = self._idempotency_record, None
        if record is not None:
            if isinstance(response, Response):
                response.render()
            fault_hook("before_answer_stored")
            try:
                idempotency.idempotent_request_finish(
                    record_id=record,
                    status=response.status_code,
                    body=response.content,
                    content_type=response.get("Content-Type", "application/json"),
                )
            except DatabaseError as error:
                if not connection_lost(error):
                    raise
                # Lost with the connection: the record stays in flight until
                # PORTAL_IDEMPOTENCY_LOCK_S, then a retry of the same request takes
                # it over (409 REQUEST_IN_FLIGHT until then).
            fault_hook("after_answer_stored")
        return response

    # Helpers for subclasses.

    def lease_token(self, request: Request) -> int:
        """The ``Lease-Token`` header: the fencing token of the caller's lease."""
        raw = request.headers.get(LEASE_TOKEN_HEADER, "")
        # isdigit() alone admits "²" (int() refuses it) and "٣" (int() reads 3).
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
            raise ValidationFailed(
                f"Send the fencing token of your lease in the {LEASE_TOKEN_HEADER} "
                "header (a non-negative integer).",
                field=LEASE_TOKEN_HEADER,
            )
        return int(raw)


class StaffApi(PortalApi):
    """Base of endpoints for people (support staff): the admin's session, with CSRF.

    The tenant is never an input: services look the object up among the tenants
    where the user holds a membership with the right role, and answer 404 otherwise.
    """

    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAuthenticated]
