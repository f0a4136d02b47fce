"""The governed MCP server over streamable HTTP, with the SDK's own client."""

from __future__ import annotations

from typing import Any

import anyio

from tests.mcp.conftest import TOOL, Agents, McpServer, arguments, http_session
from ticketdesk.harness import TicketDesk


def test_the_granted_tool_is_listed_with_the_contracts_schema(
    agents: Agents, mcp_http: McpServer
) -> None:
    async def scenario() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            return await session.list_tools()

    listed = anyio.run(scenario)

    assert [tool.name for tool in listed.tools] == [TOOL]
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
