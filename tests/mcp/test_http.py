"""The governed MCP server over streamable HTTP, with the SDK's own client."""

from __future__ import annotations

from typing import Any

import anyio

from tests.mcp.conftest import (
    TOOL,
    TOOLS,
    VERSION_TOOL,
    Agents,
    McpServer,
    arguments,
    http_session,
)
from ticketdesk.harness import TicketDesk


def test_the_granted_tool_is_listed_with_the_contracts_schema(
    agents: Agents, mcp_http: McpServer
) -> None:
    async def scenario() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            return await session.list_tools()

    listed = anyio.run(scenario)

    assert [tool.name for tool in listed.tools] == TOOLS
    tool = listed.tools[0]
    schema = tool.input_schema
    assert schema["required"] == ["idempotency_key", "object", "fields", "arguments"]
    assert schema["properties"]["fields"]["required"] == ["email", "plan"]
    email = schema["properties"]["fields"]["properties"]["email"]
    assert email["required"] == ["value", "source", "read_at"]
    assert tool.annotations is not None
    assert tool.annotations.idempotent_hint is True
    assert tool.annotations.open_world_hint is True


def test_one_key_called_twice_makes_one_ticket(
    agents: Agents, mcp_http: McpServer, desk: TicketDesk
) -> None:
    call = arguments(agents, key="ticket-twice")

    async def scenario() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            first = await session.call_tool(TOOL, call)
            second = await session.call_tool(TOOL, call)
            return first, second

    first, second = anyio.run(scenario)

    assert not first.is_error, first.content
    assert first.structured_content["status"] == "verified", first.content
    assert first.structured_content["receipt"]
    assert second.structured_content == first.structured_content
    assert agents.world.tickets("ticket-twice") == 1


def test_an_mcp_only_agent_records_the_object_version_the_fence_checks(
    agents: Agents, mcp_http: McpServer, desk: TicketDesk
) -> None:
    # arguments() records version 7; the agent then reads version 8 at the source.
    stale = arguments(agents, 5150, key="ticket-5150-before")
    stale["object"]["version"] = "8"
    fresh = {**stale, "idempotency_key": "ticket-5150-after"}

    async def scenario() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            before = await session.call_tool(TOOL, stale)
            missing = await session.call_tool(
                VERSION_TOOL, {"object_type": "customer_issue", "object_id": "5150"}
            )
            recorded = await session.call_tool(
                VERSION_TOOL,
                {"object_type": "customer_issue", "object_id": "5150", "version": "8"},
            )
            after = await session.call_tool(TOOL, fresh)
            return before, missing, recorded, after

    before, missing, recorded, after = anyio.run(scenario)

    assert before.structured_content["reason_code"] == "VERSION_CONFLICT", before
    assert missing.is_error
    assert missing.structured_content["argument"] == "version"
    assert not recorded.is_error, recorded.content
    assert recorded.structured_content["status"] == "recorded"
    assert recorded.structured_content["version"] == "8"
    assert after.structured_content["status"] == "verified", after.content
    assert agents.world.tickets("ticket-5150-after") == 1
    assert agents.world.tickets("ticket-5150-before") == 0
