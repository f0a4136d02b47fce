"""Done when: an MCP client with only the banner's URL and key lists and calls the
demo's governed tool. ``manage.py up`` as the README runs it (scratch database, free
ports, spans to a collector), the SDK's own client, then Ctrl-C."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types

from tests.mcp.conftest import VERSION_TOOL, http_session
from tests.support.net import free_port
from tests.support.otlp import Receiver, otlp_receiver
from tests.support.up import (
    STOP_TIMEOUT_S,
    running_up,
    scratch_database_url,
    wait_ready,
)

__all__ = ["scratch_database_url"]  # the fixture, from tests/support/up.py

MCP_URL = re.compile(r"MCP:\s+(http://\S+)")
DEMO_TOOL = "create_ticket__ticket-desk"


def _demo_call() -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).isoformat()
    return {
        "idempotency_key": "mcp-ticket-for-issue-77",
        "object": {"type": "customer_issue", "id": "77", "version": "1"},
        "fields": {
            "email": {"value": "ana@example.com", "source": "crm", "read_at": now},
            "plan": {"value": "pro", "source": "billing", "read_at": now},
        },
        "arguments": {"queue": "billing", "summary": "Refund for issue 77"},
    }


def _spans_of(
    receiver: Receiver, trace_id: str, names: set[str], services: set[str]
) -> list[Any]:
    """The trace's spans once spans of each name's first word, and of each service,
    arrived (30 s): each process exports its spans in its own batches."""
    end = time.monotonic() + 30
    while time.monotonic() < end:
        spans = [s for s in receiver.received() if s.trace_id == trace_id]
        if names <= {s.name.split(" ")[0] for s in spans} and services <= {
            s.service for s in spans
        }:
            return spans
        time.sleep(0.5)
    return [s for s in receiver.received() if s.trace_id == trace_id]


def test_the_banners_mcp_url_and_key_list_and_call_the_demo_tool(
    scratch_database_url: str, tmp_path: Path
) -> None:
    with otlp_receiver() as receiver:
        port, desk_port, mcp_port = free_port(), free_port(), free_port()
        portal = f"http://127.0.0.1:{port}"
        with running_up(
            scratch_database_url,
            tmp_path,
            port=port,
            args=["--no-worker"],
            PORTAL_TICKETDESK_PORT=str(desk_port),
            PORTAL_MCP_PORT=str(mcp_port),
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
            OTEL_BSP_SCHEDULE_DELAY="200",
        ) as up:
            process, pump = up.process, up.pump
            assert pump is not None
            try:
                key, desk = wait_ready(up, portal)
                mcp_url = up.search(MCP_URL)
                assert mcp_url == f"http://127.0.0.1:{mcp_port}/mcp", up.output()

                async def scenario() -> Any:
                    async with http_session(mcp_url, key) as session:
                        listed = await session.list_tools()
                        # With nothing but the banner's URL and key: the agent tells
                        # the portal the current version, then acts on it.
                        recorded = await session.call_tool(
                            VERSION_TOOL,
                            {
                                "object_type": "customer_issue",
                                "object_id": "77",
                                "version": "1",
                            },
                        )
                        assert not recorded.is_error, recorded.content
                        called = await session.call_tool(DEMO_TOOL, _demo_call())
                        return listed, called

                listed, called = anyio.run(scenario)

                assert [tool.name for tool in listed.tools] == [DEMO_TOOL, VERSION_TOOL]
                answer = called.structured_content
                assert answer["status"] == "verified", called.content
                effects = httpx.get(f"{desk}/_control/effects", trust_env=False).json()
                assert effects["tickets_created"] == 1, effects

                # One trace from the MCP request through the tool span and the gateway
                # to the desk.
                story = anyio.run(_story, mcp_url, key, answer["resources"]["story"])
                trace_id = story["trace_id"]
                spans = _spans_of(
                    receiver,
                    trace_id,
                    {"tools/call", "execute_tool"},
                    {"portal-mcp", "ticketdesk"},
                )
                by_id = {s.span_id: s for s in spans}
                tools = [
                    s
                    for s in spans
                    if s.name == f"execute_tool {DEMO_TOOL}"
                    and s.service == "portal-mcp"
                ]
                assert len(tools) == 1, sorted((s.service, s.name) for s in spans)
                tool = tools[0]
                assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
                assert tool.attributes["gen_ai.tool.name"] == DEMO_TOOL
                assert tool.attributes["gen_ai.tool.call.id"]
                assert by_id[tool.parent_span_id].name.startswith("tools/call")
                gateway = [
                    s
                    for s in spans
                    if s.name.startswith("execute_tool ") and s is not tool
                ]
                assert gateway, [s.name for s in spans]
                assert {s.service for s in spans} >= {"portal-mcp", "ticketdesk"}, {
                    (s.service, s.name) for s in spans
                }
            finally:
                process.send_signal(signal.SIGINT)
                returncode = process.wait(STOP_TIMEOUT_S)
                pump.join(10)
            assert returncode == 0, up.output()


async def _story(url: str, key: str, uri: str) -> dict[str, Any]:
    async with http_session(url, key) as session:
        read = await session.read_resource(uri)
    contents = read.contents[0]
    assert isinstance(contents, types.TextResourceContents)
    return json.loads(contents.text)
