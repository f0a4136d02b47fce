"""OpenTelemetry: the tracer provider and the instrumentations, once per process.

``setup`` is called where a process starts serving: the web server (``config/wsgi.py``
when a gunicorn worker loads the application, and gunicorn's ``post_fork`` hook in
``gunicorn.conf.py``), each Celery worker process (``worker_process_init``, or
``worker_init`` for a pool that does not fork; ``config/celery.py``), and management
commands (``manage.py``). It is idempotent within a process.

The SDK's tracer provider is always installed, so every request, job and gateway
call has real W3C trace and span ids (stored on tasks, operations and events, and
sent as ``traceparent`` to the remote system and the event consumers). Spans are
exported, over OTLP/HTTP by a batch processor, only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set;
otherwise no span processor is registered and spans are dropped as they end.
The exporter reads the standard ``OTEL_*`` variables (headers, timeout, service
name, resource attributes, sampler); docs/observability.md lists them.
"""

from __future__ import annotations

import os
import threading
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

ENDPOINT_VARIABLES: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)

_lock = threading.Lock()
_provider: TracerProvider | None = None


def export_enabled() -> bool:
    """True when an OTLP endpoint is configured (the only case spans are exported)."""
    return any(os.environ.get(name) for name in ENDPOINT_VARIABLES)


def _exporter() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter,
    )

    return OTLPSpanExporter()


def setup(service: str) -> TracerProvider:
    """Install the tracer provider and the instrumentations in this process.

    ``service`` is the ``service.name`` unless ``OTEL_SERVICE_NAME`` names one.
    Raises ImproperlyConfigured when the settings refuse to load. A second call
    in the same process returns the provider already installed; in a
    forked child of a process that ran it, the SDK's batch processor restarts its
    export thread by itself (``os.register_at_fork``), so the provider is kept.
    """
    global _provider
    with _lock:
        if _provider is not None:
            return _provider
        # Load the settings first: their refusal (ImproperlyConfigured) must stop
        # here, not be papered over by the Django instrumentation's fallback.
        from django.conf import settings

        settings.MIDDLEWARE  # noqa: B018
        named = os.environ.get("OTEL_SERVICE_NAME")
        attributes = {} if named else {SERVICE_NAME: service}
        provider = TracerProvider(resource=Resource.create(attributes))
        if export_enabled():
            provider.add_span_processor(BatchSpanProcessor(_exporter()))
        trace.set_tracer_provider(provider)
        _instrument()
        _provider = provider
        return provider


def _instrument() -> None:
    """Django (server spans, ``traceparent`` in; when exporting), Celery (job
    headers, both sides), psycopg (statement spans, when exporting) and httpx (the
    connectors' calls, ``traceparent`` out).
    """
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    # Django's middleware is read when the WSGI handler is built: setup runs first.
    # Server spans with their attributes only where they go somewhere: without an
    # exporter, portal.tracing.RequestSpanMiddleware gives each request the same
    # ids for a tenth of the instrumentation's CPU (docs/observability.md).
    if export_enabled():
        DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()
    # Statement spans only where they go somewhere: the instrumentation costs about
    # 130 µs of client CPU per statement (docs/observability.md, "Instrumentation"),
    # a dropped span included. No SQL commenter: statements stay as written.
    if export_enabled():
        PsycopgInstrumentor().instrument(enable_commenter=False)
    HTTPXClientInstrumentor().instrument()
