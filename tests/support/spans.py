"""The SDK's in-memory exporter for in-process span tests.

The global tracer provider can be set once per process: the first use installs an
SDK provider whose spans go to one ``InMemorySpanExporter``, and instruments httpx
(the connectors' client) as ``portal.telemetry`` does. Each test clears it first.
"""

from __future__ import annotations

from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

_exporter: InMemorySpanExporter | None = None


def in_memory_exporter() -> InMemorySpanExporter:
    global _exporter
    if _exporter is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        HTTPXClientInstrumentor().instrument()
    return _exporter


def cleared_spans() -> Iterator[InMemorySpanExporter]:
    """For a fixture: ``yield from cleared_spans()``."""
    exporter = in_memory_exporter()
    exporter.clear()
    yield exporter
    exporter.clear()
