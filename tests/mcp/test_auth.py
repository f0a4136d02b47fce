"""Agent keys as Bearer tokens: discovered through RFC 9728 metadata, refused when
missing, revoked or expired, as on the REST API, on both transports."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anyio
import httpx
from django.db import connection

from audit.models import Event
from portal import scope
from portal import services as portal_services
from portal.models import AgentKey
from tests.mcp.conftest import (
    REPO,
    TOOL,
    TOOLS,
    Agents,
    McpServer,
    arguments,
    http_session,
    raw_post,
    server_env,
    stdio_session,
)

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


def _revoke(agents: Agents) -> None:
    """Revoke the agent's key from another thread (the test's loop is running)."""
    try:
        with scope.tenant_scope([agents.tenant.pk]):
            key = AgentKey.objects.get(prefix=agents.secret.partition(".")[0])
            portal_services.agent_key_revoke(key=key)
    finally:
        connection.close()


def test_the_protected_resource_metadata_names_the_endpoint(
    mcp_http: McpServer,
) -> None:
    base = mcp_http.url.removesuffix("/mcp")
    refused = raw_post(mcp_http.url, None, INITIALIZE)
    metadata = httpx.get(f"{base}/.well-known/oauth-protected-resource/mcp")

    assert refused.status_code == 401
    challenge = refused.headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"' in (
        challenge
    )
    assert metadata.status_code == 200
    assert metadata.json()["resource"] == mcp_http.url
    assert metadata.json()["bearer_methods_supported"] == ["header"]
    servers = metadata.json()["authorization_servers"]
    assert servers and not servers[0].endswith("/")  # the issuer as configured


def test_an_unknown_key_is_refused_at_the_door(mcp_http: McpServer) -> None:
    refused = raw_post(mcp_http.url, "nokey.secret", INITIALIZE)
    assert refused.status_code == 401
    assert "invalid_token" in refused.headers["WWW-Authenticate"]


def _refusals(agents: Agents) -> list[dict[str, Any]]:
    """The payloads of the tenant's ``agent_key.refused`` events, oldest first."""
    with scope.tenant_scope([agents.tenant.pk]):
        events = Event.objects.filter(tenant=agents.tenant, code="agent_key.refused")
        return [event.payload for event in events.order_by("id")]


def test_an_expired_key_is_refused_and_recorded_in_its_tenant(
    agents: Agents, mcp_http: McpServer
) -> None:
    """As on the REST API: each use of the exact secret of an expired key writes
    ``agent_key.refused`` in its tenant (prefix, never the secret); a wrong secret
    for the same prefix writes nothing."""
    prefix, _, hidden = agents.secret.partition(".")
    # The cutoff arrives: set in the past by raw SQL (the service refuses that).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE portal_agentkey SET created_at = app_now() - interval '2 hours', "
            "expires_at = app_now() - interval '1 second' WHERE prefix = %s",
            [prefix],
        )
    assert (
        raw_post(mcp_http.url, f"{prefix}.not-the-secret", INITIALIZE).status_code
        == 401
    )
    assert _refusals(agents) == []

    assert raw_post(mcp_http.url, agents.secret, INITIALIZE).status_code == 401
    assert raw_post(mcp_http.url, agents.secret, INITIALIZE).status_code == 401

    refusals = _refusals(agents)
    assert len(refusals) == 2
    assert {
        (p["code"], p["key_prefix"], p["status"], p["address"], p["method"], p["path"])
        for p in refusals
    } == {("API_KEY_EXPIRED", prefix, "expired", "127.0.0.1", "POST", "/mcp")}
    assert hidden not in str(refusals)


def test_a_key_revoked_mid_session_is_refused_at_the_next_request(
    agents: Agents, mcp_http: McpServer
) -> None:
    call = arguments(agents, key="ticket-after-revoke")

    async def scenario() -> tuple[Any, str]:
        async with http_session(mcp_http.url, agents.secret) as session:
            listed = await session.list_tools()
            await anyio.to_thread.run_sync(_revoke, agents)
            try:
                await session.call_tool(TOOL, call, read_timeout_seconds=10)
            except Exception as error:  # the transport's 401  # noqa: BLE001
                return listed, repr(error)
            return listed, "answered"

    listed, refused = anyio.run(scenario)

    assert [tool.name for tool in listed.tools] == TOOLS
    # The SDK's client reports the transport's refusal as an error response; the
    # same request without it shows the 401 the server sent.
    assert refused == "MCPError(-32603, 'Server returned an error response', None)"
    assert raw_post(mcp_http.url, agents.secret, INITIALIZE).status_code == 401
    assert agents.world.tickets() == 0
    # Both refused requests are in the tenant's record, as revoked.
    assert [(p["code"], p["status"]) for p in _refusals(agents)] == [
        ("API_KEY_REVOKED", "revoked")
    ] * 2


def test_stdio_lists_and_calls_as_the_environment_key(agents: Agents) -> None:
    call = arguments(agents, key="ticket-stdio")

    async def scenario() -> Any:
        async with stdio_session(agents.secret) as session:
            listed = await session.list_tools()
            first = await session.call_tool(TOOL, call)
            second = await session.call_tool(TOOL, call)
            await anyio.to_thread.run_sync(_revoke, agents)
            after = await session.call_tool(TOOL, call)
            return listed, first, second, after

    listed, first, second, after = anyio.run(scenario)

    assert [tool.name for tool in listed.tools] == TOOLS
    assert first.structured_content["status"] == "verified", first.content
    assert second.structured_content == first.structured_content
    # Revoked mid-session: the next call is refused, the session goes on.
    assert after.is_error
    assert after.structured_content["code"] == "API_KEY_REVOKED"
    assert agents.world.tickets("ticket-stdio") == 1
    [refusal] = _refusals(agents)
    assert (refusal["status"], refusal["address"], refusal["method"]) == (
        "revoked",
        "stdio",
        "tools/call",
    )


def test_stdio_refuses_to_start_without_a_live_key(agents: Agents) -> None:
    _revoke(agents)
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
    assert b"API_KEY_REVOKED" in started.stderr
