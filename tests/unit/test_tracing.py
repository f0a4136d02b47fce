"""portal/tracing.py with the SDK: ids from the current span, the W3C propagator,
and the message spans that carry an event's trace from the relay to a consumer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, format_span_id, format_trace_id

from portal import tracing
from portal.tracing import NO_TRACE, Trace
from tests.support.spans import cleared_spans

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from cleared_spans()


def test_a_valid_traceparent_is_parsed_by_the_propagator():
    trace = Trace.from_traceparent(f"00-{TRACE_ID}-{SPAN_ID}-01")
    assert trace == Trace(trace_id=TRACE_ID, span_id=SPAN_ID)


def test_an_invalid_or_all_zero_traceparent_starts_a_new_trace():
    for header in (None, "", "garbage", f"00-{'0' * 32}-{SPAN_ID}-01",
                   f"00-{TRACE_ID}-{'0' * 16}-01", f"00-{TRACE_ID[:-1]}-{SPAN_ID}-01"):
        trace = Trace.from_traceparent(header)
        assert len(trace.trace_id) == 32 and len(trace.span_id) == 16, header
        assert trace.trace_id != TRACE_ID, header


def test_current_is_the_current_span_and_empty_outside_one(spans: InMemorySpanExporter):
    assert Trace.current() == NO_TRACE
    with tracing.tracer("test").start_as_current_span("outer") as span:
        context = span.get_span_context()
        assert Trace.current() == Trace(
            trace_id=format_trace_id(context.trace_id),
            span_id=format_span_id(context.span_id),
        )
        assert NO_TRACE.or_current() == Trace.current()
    assert NO_TRACE.or_current() == NO_TRACE


def test_a_child_span_of_a_stored_trace_joins_it(spans: InMemorySpanExporter):
    stored = Trace(trace_id=TRACE_ID, span_id=SPAN_ID)
    with tracing.child_span("work", parent=stored) as (_span, current):
        assert current.trace_id == TRACE_ID and current.span_id != SPAN_ID
    (finished,) = spans.get_finished_spans()
    assert finished.parent is not None and format_span_id(finished.parent.span_id) == SPAN_ID
    assert finished.instrumentation_scope is not None
    assert finished.instrumentation_scope.schema_url == tracing.SEMCONV_SCHEMA_URL


def test_the_message_headers_carry_the_event_trace_to_the_consumer(
    spans: InMemorySpanExporter,
):
    # Given: the relay publishes an event of a stored trace (the envelope's id only)
    with tracing.producer_span("task.transitioned publish", parent=Trace(trace_id=TRACE_ID)) as headers:
        pass
    assert headers["traceparent"].startswith(f"00-{TRACE_ID}-")
    # When: a consumer processes the message with those headers
    with tracing.consumer_span("task.transitioned process", headers={"tenant_id": "t", **headers}):
        assert Trace.current().trace_id == TRACE_ID
    # Then: producer → consumer, parent and child, in the event's trace
    producer, consumer = spans.get_finished_spans()
    assert producer.kind == SpanKind.PRODUCER and consumer.kind == SpanKind.CONSUMER
    assert consumer.parent is not None
    assert consumer.parent.span_id == producer.context.span_id
    assert format_trace_id(consumer.context.trace_id) == TRACE_ID


def test_no_trace_and_no_current_span_means_no_headers(spans: InMemorySpanExporter):
    assert trace.get_current_span().get_span_context().is_valid is False
    with tracing.producer_span("x publish", parent=NO_TRACE) as headers:
        assert headers == {}
    assert spans.get_finished_spans() == ()
