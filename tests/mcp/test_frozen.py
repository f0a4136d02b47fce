"""The kill switch on the MCP server: a frozen agent or tenant is refused there as
on the REST API (same codes, a denial event each), on both transports, from the
first request after the freeze commits, and served again once unfrozen."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import anyio
from django.db import connection
from mcp.shared.exceptions import MCPError

from audit.models import Event, EventCode
from limits import services as limits_services
from mcp_server.tools import story_uri
from portal import scope
from tests.mcp.conftest import (
    REPO,
    TOOL,
    TOOLS,
    Agents,
    McpServer,
    arguments,
    http_session,
    server_env,
    stdio_session,
)

KEY_REFUSED = -32600  # the JSON-RPC error the server answers a refused key with


def _freeze(agents: Agents, *, agent: bool, frozen: bool) -> None:
    """Freeze (or unfreeze) the agent or its tenant with the service, from another
    thread (the test's loop is running)."""
    try:
        with scope.tenant_scope([agents.tenant.pk]):
            if agent:
                limits_services.agent_freeze(
                    tenant=agents.tenant, agent_id=agents.world.agent.pk, frozen=frozen
                )
            else:
                limits_services.tenant_freeze(tenant=agents.tenant, frozen=frozen)
    finally:
        connection.close()


def _tickets(agents: Agents, key: str) -> int:
    return agents.world.tickets(key)


def _denials(agents: Agents, reason: str) -> list[Event]:
    return list(
        Event.objects.filter(
            tenant=agents.tenant, code=EventCode.GATEWAY_CHECKED, reason_code=reason
        ).order_by("id")
    )


async def _refused_read(session: Any, uri: str) -> MCPError | None:
    try:
        await session.read_resource(uri)
    except MCPError as error:
        return error
    return None


async def _refused_list(session: Any) -> MCPError | None:
    try:
        await session.list_tools()
    except MCPError as error:
        return error
    return None


def test_an_agent_frozen_mid_session_is_refused_and_served_again_when_unfrozen(
    agents: Agents, mcp_http: McpServer
) -> None:
    call = arguments(agents, key="ticket-after-freeze")
    story = story_uri(uuid.uuid4())

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with http_session(mcp_http.url, agents.secret) as session:
            seen["before"] = await session.list_tools()
            # when a person freezes the agent between two requests of the session
            await anyio.to_thread.run_sync(
                lambda: _freeze(agents, agent=True, frozen=True)
            )
            seen["list"] = await _refused_list(session)
            seen["call"] = await session.call_tool(TOOL, call, read_timeout_seconds=30)
            seen["read"] = await _refused_read(session, story)
            seen["tickets_frozen"] = await anyio.to_thread.run_sync(
                _tickets, agents, "ticket-after-freeze"
            )
            # and unfreezes it: the same session is served again
            await anyio.to_thread.run_sync(
                lambda: _freeze(agents, agent=True, frozen=False)
            )
            seen["after"] = await session.list_tools()
            seen["call_after"] = await session.call_tool(
                TOOL, call, read_timeout_seconds=30
            )
        return seen

    seen = anyio.run(scenario)

    assert [tool.name for tool in seen["before"].tools] == TOOLS
    # then tools/list and resources/read are the refused key's JSON-RPC error,
    # naming the code
    for refused in (seen["list"], seen["read"]):
        assert isinstance(refused, MCPError)
        assert refused.code == KEY_REFUSED
        assert refused.message.startswith("AGENT_FROZEN: ")
    # and tools/call is a tool error saying a person stopped the agent
    assert seen["call"].is_error
    answer = seen["call"].structured_content
    assert answer["code"] == "AGENT_FROZEN"
    assert "A person stopped this agent" in answer["next_step"]
    # and nothing reached the desk while frozen
    assert seen["tickets_frozen"] == 0
    # and each refusal is one denial event naming the agent and the method
    denials = _denials(agents, "AGENT_FROZEN")
    assert [d.payload["method"] for d in denials] == [
        "tools/list",
        "tools/call",
        "resources/read",
    ]
    assert {d.payload["phase"] for d in denials} == {"mcp"}
    assert {d.actor_id for d in denials} == {str(agents.world.agent.pk)}
    # and once unfrozen the agent lists and acts again
    assert [tool.name for tool in seen["after"].tools] == TOOLS
    assert seen["call_after"].structured_content["status"] == "verified", seen[
        "call_after"
    ].content
    assert agents.world.tickets("ticket-after-freeze") == 1


def test_a_frozen_tenant_is_refused_as_tenant_frozen(
    agents: Agents, mcp_http: McpServer
) -> None:
    call = arguments(agents, key="ticket-tenant-frozen")

    async def scenario() -> tuple[MCPError | None, Any]:
        async with http_session(mcp_http.url, agents.secret) as session:
            await session.list_tools()
            await anyio.to_thread.run_sync(
                lambda: _freeze(agents, agent=False, frozen=True)
            )
            listed = await _refused_list(session)
            called = await session.call_tool(TOOL, call, read_timeout_seconds=30)
            return listed, called

    listed, called = anyio.run(scenario)

    assert isinstance(listed, MCPError)
    assert listed.code == KEY_REFUSED
    assert listed.message.startswith("TENANT_FROZEN: ")
    assert called.is_error
    assert called.structured_content["code"] == "TENANT_FROZEN"
    assert "A person stopped this agent" in called.structured_content["next_step"]
    assert agents.world.tickets("ticket-tenant-frozen") == 0
    assert len(_denials(agents, "TENANT_FROZEN")) == 2
    assert _denials(agents, "AGENT_FROZEN") == []


def test_stdio_refuses_a_frozen_agent_mid_session_and_at_start(agents: Agents) -> None:
    call = arguments(agents, key="ticket-stdio-frozen")

    async def scenario() -> tuple[MCPError | None, Any]:
        async with stdio_session(agents.secret) as session:
            await session.list_tools()
            await anyio.to_thread.run_sync(
                lambda: _freeze(agents, agent=True, frozen=True)
            )
            return await _refused_list(session), await session.call_tool(TOOL, call)

    listed, called = anyio.run(scenario)

    assert isinstance(listed, MCPError)
    assert listed.message.startswith("AGENT_FROZEN: ")
    assert called.structured_content["code"] == "AGENT_FROZEN"
    assert agents.world.tickets("ticket-stdio-frozen") == 0
    # and a new stdio server does not start for it
    started = subprocess.run(
        [sys.executable, "manage.py", "mcp", "--stdio"],
        cwd=REPO,
        env=server_env(PORTAL_API_KEY=agents.secret),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert started.returncode != 0
    assert b"AGENT_FROZEN" in started.stderr
    methods = [d.payload["method"] for d in _denials(agents, "AGENT_FROZEN")]
    assert methods == ["tools/list", "tools/call", "stdio"]
