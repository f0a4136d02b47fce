"""The gateway's spans, with the SDK's in-memory exporter: a GenAI ``execute_tool``
span under the agent's request trace, the connector's HTTP call (``traceparent``
to the ticket desk) under it, and the ids stored on the events it writes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, format_span_id, format_trace_id

from audit.models import Event
from portal import tracing
from tests.gateway.conftest import World, minutes_ago
from tests.support.spans import cleared_spans


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from cleared_spans()


def _tool_span(spans: InMemorySpanExporter, operation_id: str):
    tools = [
        s
        for s in spans.get_finished_spans()
        if s.attributes and s.attributes.get("gen_ai.tool.call.id") == operation_id
    ]
    assert len(tools) == 1, [s.name for s in spans.get_finished_spans()]
    return tools[0]


def test_an_execution_is_one_execute_tool_span_over_the_desk_call(
    world: World, spans: InMemorySpanExporter
):
    # Given: a reserved operation
    started = world.start_task()
    operation_id = started["operation"]["id"]
    spans.clear()
    # When: the agent executes it, in its own trace (its httpx client, instrumented
    # here too, sends the traceparent)
    with tracing.tracer("agent").start_as_current_span("agent") as agent:
        response = world.execute(started)
    trace_id = format_trace_id(agent.get_span_context().trace_id)
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "verified"
    request_span = response.headers["traceparent"].split("-")[2]

    # Then: the GenAI tool span, in the agent's trace under the request's span
    tool = _tool_span(spans, operation_id)
    assert tool.name == "execute_tool create_ticket"
    assert tool.kind == SpanKind.INTERNAL
    assert format_trace_id(tool.context.trace_id) == trace_id
    assert tool.parent is not None
    assert format_span_id(tool.parent.span_id) == request_span
    assert dict(tool.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "create_ticket",
        "gen_ai.tool.call.id": operation_id,
        "gen_ai.tool.type": "extension",
        "portal.gateway.verdict": "verified",
        "portal.gateway.target": "ticket-desk",
    }
    # And: the connector's call to the desk is its child (httpx sends its
    # traceparent), nothing of the call outside the tool span
    desk = str(world.desk.url)
    calls = [
        s
        for s in spans.get_finished_spans()
        if s.kind == SpanKind.CLIENT
        and desk in str((s.attributes or {}).get("http.url", ""))
    ]
    assert calls and all(
        c.parent is not None and c.parent.span_id == tool.context.span_id
        for c in calls
    ), [(c.name, c.parent) for c in calls]
    # And: the events the execution wrote carry the tool span's ids
    stored = set(
        Event.objects.filter(operation_id=operation_id, code="gateway.checked")
        .values_list("trace_id", "span_id")
        .distinct()
    )
    assert stored == {(trace_id, format_span_id(tool.context.span_id))}


def test_a_refusal_records_the_verdict_and_reason_code(
    world: World, spans: InMemorySpanExporter
):
    # Given: a reserved operation and an e-mail read too long ago
    started = world.start_task()
    operation_id = started["operation"]["id"]
    # When: the agent executes it
    response = world.execute(
        started, world.fields(email={"observed_at": minutes_ago(30)})
    )
    assert response.status_code == 422, response.text
    # Then: the span says so; no call was made
    tool = _tool_span(spans, operation_id)
    assert tool.attributes is not None
    assert tool.attributes["portal.gateway.verdict"] == "refused"
    assert tool.attributes["portal.gateway.reason_code"] == "FIELD_STALE"
    desk = str(world.desk.url)
    assert not [
        s
        for s in spans.get_finished_spans()
        if desk in str((s.attributes or {}).get("http.url", ""))
    ]
