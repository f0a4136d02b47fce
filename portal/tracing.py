"""W3C Trace Context: the ids a request carries into tasks, operations and events.

``Trace`` is the value the services take and store (``trace_id``/``span_id`` on
tasks, operations and events). It is read from OpenTelemetry's current span
(``Trace.current``), or parsed from a ``traceparent`` header by the SDK's W3C
propagator when no span is current (a process where ``portal.telemetry.setup`` did
not run, e.g. the test client). The tracer provider itself is set up once per
process in ``portal.telemetry`` (docs/observability.md).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from django.http import HttpRequest, HttpResponseBase
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.semconv.schemas import Schemas
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    format_span_id,
    format_trace_id,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# The semantic conventions the portal's own spans follow (the GenAI tool-execution
# span of the gateway among them): the release that opentelemetry-semantic-conventions
# 0.66b1 (pinned in pyproject.toml) ships as its newest schema.
SEMCONV_SCHEMA_URL: Final = Schemas.V1_44_0.value

_W3C: Final = TraceContextTextMapPropagator()


def tracer(name: str) -> otel_trace.Tracer:
    """The tracer of one portal module, stamped with the semconv schema we follow."""
    return otel_trace.get_tracer(name, schema_url=SEMCONV_SCHEMA_URL)


@dataclass(frozen=True, kw_only=True)
class Trace:
    trace_id: str = ""
    span_id: str = ""

    @classmethod
    def current(cls) -> Trace:
        """The current OpenTelemetry span's ids; ``NO_TRACE`` when none is valid."""
        context = otel_trace.get_current_span().get_span_context()
        if not context.is_valid:
            return NO_TRACE
        return cls(
            trace_id=format_trace_id(context.trace_id),
            span_id=format_span_id(context.span_id),
        )

    @classmethod
    def from_traceparent(cls, header: str | None) -> Trace:
        """Parse a ``traceparent`` header; a missing or invalid one starts a new trace.

        The SDK's W3C propagator parses it (all-zero ids are invalid by the spec and
        are replaced too).
        """
        extracted = _W3C.extract({"traceparent": header or ""})
        context = otel_trace.get_current_span(extracted).get_span_context()
        if context.is_valid:
            return cls(
                trace_id=format_trace_id(context.trace_id),
                span_id=format_span_id(context.span_id),
            )
        return cls.new()

    @classmethod
    def new(cls) -> Trace:
        return cls(trace_id=secrets.token_hex(16), span_id=secrets.token_hex(8))

    def or_current(self) -> Trace:
        """This trace, or the current span's when this one is empty (``NO_TRACE``)."""
        return self if self.trace_id else Trace.current()

    def span_context(self) -> SpanContext | None:
        """These ids as a remote parent for a new span; None when not valid."""
        try:
            trace_id, span_id = int(self.trace_id, 16), int(self.span_id or "0", 16)
        except ValueError:
            return None
        if not span_id:
            # A stored trace without a span: parent under a made-up span of it, so
            # the new span still joins the trace.
            span_id = int(secrets.token_hex(8), 16)
        context = SpanContext(
            trace_id=trace_id,
            span_id=span_id,
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        return context if context.is_valid else None


NO_TRACE = Trace()


def traceparent_of(trace: Trace) -> str:
    """The ``traceparent`` header naming ``trace`` as the parent."""
    return f"00-{trace.trace_id}-{trace.span_id}-01"


def spans_recorded() -> bool:
    """True when a span started now would reach a span processor (an exporter).

    False with no SDK in this process (the API's no-op provider) and with an SDK
    provider that has no processor (``portal.telemetry`` adds one only when an
    OTLP endpoint is set): then a span is made and dropped unseen, and a caller
    that only needs the ids it would carry may skip making it (the relay, per
    message: ``audit.broker``).
    """
    provider = otel_trace.get_tracer_provider()
    # The SDK keeps its processors here (opentelemetry-sdk, pinned in pyproject.toml).
    processors = getattr(getattr(provider, "_active_span_processor", None),
                         "_span_processors", ())  # fmt: skip
    return bool(processors)


def unrecorded_traceparent(parent: Trace) -> str | None:
    """The ``traceparent`` a PRODUCER span under ``parent`` would carry, when no
    span is recorded (``spans_recorded()`` is False): ``parent``'s trace id and a
    fresh span id. None when ``parent`` is not a valid trace."""
    remote = parent.span_context()
    if remote is None:
        return None
    return f"00-{format_trace_id(remote.trace_id)}-{secrets.token_hex(8)}-01"


@contextmanager
def producer_span(
    name: str, *, parent: Trace, attributes: Mapping[str, Any] | None = None
) -> Iterator[dict[str, str]]:
    """A PRODUCER span under ``parent`` (stored ids); yields the headers to send.

    The headers carry the W3C ``traceparent`` of the new span, injected by the
    configured propagator. With no valid parent the span joins the current span's
    trace; with neither, nothing is traced and no headers are yielded.
    """
    remote = parent.span_context()
    if remote is None and not otel_trace.get_current_span().get_span_context().is_valid:
        yield {}
        return
    ctx = (
        otel_trace.set_span_in_context(NonRecordingSpan(remote))
        if remote is not None
        else otel_context.get_current()
    )
    with tracer(__name__).start_as_current_span(
        name, context=ctx, kind=SpanKind.PRODUCER, attributes=attributes
    ):
        headers: dict[str, str] = {}
        # With no SDK in this process the span is the parent itself: still a valid
        # traceparent in the event's trace.
        inject(headers)
        yield headers


@contextmanager
def consumer_span(
    name: str,
    *,
    headers: Mapping[str, Any] | None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[otel_trace.Span]:
    """A CONSUMER span continuing the trace of a received message's headers."""
    carrier = {
        key: str(value) for key, value in (headers or {}).items() if value is not None
    }
    ctx = _W3C.extract(carrier)
    with tracer(__name__).start_as_current_span(
        name, context=ctx, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


@contextmanager
def child_span(
    name: str,
    *,
    parent: Trace,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[tuple[otel_trace.Span, Trace]]:
    """A span under the current one, or under ``parent`` when that is another trace.

    Yields the span and the ``Trace`` to store while it runs: the new span's ids,
    or ``parent`` unchanged where no SDK records spans.
    """
    ctx = None
    if parent.trace_id and parent.trace_id != Trace.current().trace_id:
        remote = parent.span_context()
        if remote is not None:
            ctx = otel_trace.set_span_in_context(NonRecordingSpan(remote))
    with tracer(__name__).start_as_current_span(
        name, context=ctx, kind=kind, attributes=attributes
    ) as span:
        current = Trace.current()
        recording = span.is_recording() and current.trace_id
        yield span, (current if recording else parent)


_IDS: Final = RandomIdGenerator()


class _MetaGetter:
    """Headers out of a WSGI ``META``, for the configured propagator."""

    @staticmethod
    def get(carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return None if value is None else [value]

    @staticmethod
    def keys(carrier: Mapping[str, Any]) -> list[str]:
        return [k[5:].lower().replace("_", "-") for k in carrier if k[:5] == "HTTP_"]


class RequestSpanMiddleware:
    """The request's span, where the Django instrumentation does not make one.

    ``portal.telemetry`` installs OpenTelemetry's Django instrumentation only when
    spans are exported: it collects a dozen attributes, resolves the URL a second
    time and builds the absolute URI three times per request, about a tenth of a
    reserve request's CPU in the web (docs/performance-log.md, "Issue 23: the
    REST request's CPU in the web"), for a span no processor keeps. Without it,
    this middleware gives the request the same ids: it continues the caller's
    ``traceparent`` (the configured propagator) or starts a trace, with a span id
    of its own, current while the request runs, so ``Trace.current()``, the
    stored ids, the answer's ``traceparent``, the Celery and httpx propagation see
    what they saw. The span is a real SERVER span when a processor would keep it
    (``spans_recorded()``, e.g. a test's in-memory exporter), else a non-recording
    span with the SDK's ids and flags. With the instrumentation installed its
    span is current already and this passes the request on.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if otel_trace.get_current_span().get_span_context().is_valid:
            return self.get_response(request)
        parent = extract(request.META, getter=_MetaGetter())  # type: ignore[arg-type]
        if spans_recorded():
            with tracer(__name__).start_as_current_span(
                request.method or "HTTP", context=parent, kind=SpanKind.SERVER
            ) as span:
                response = self.get_response(request)
                match = getattr(request, "resolver_match", None)
                if match is not None and match.route:
                    span.update_name(f"{request.method} {match.route}")
                    span.set_attribute("http.route", match.route)
                span.set_attribute("http.response.status_code", response.status_code)
                return response
        remote = otel_trace.get_current_span(parent).get_span_context()
        if remote.is_valid:  # the caller's trace, flags and state, as the SDK keeps
            ids = SpanContext(
                trace_id=remote.trace_id,
                span_id=_IDS.generate_span_id(),
                is_remote=False,
                trace_flags=remote.trace_flags,
                trace_state=remote.trace_state,
            )
        else:  # a new trace; the default sampler samples it
            ids = SpanContext(
                trace_id=_IDS.generate_trace_id(),
                span_id=_IDS.generate_span_id(),
                is_remote=False,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
        span = NonRecordingSpan(ids)
        token = otel_context.attach(otel_trace.set_span_in_context(span, parent))
        try:
            return self.get_response(request)
        finally:
            otel_context.detach(token)
