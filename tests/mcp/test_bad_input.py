"""Bad input is a tool error naming the argument, never a protocol error or a 5xx;
the server answers the next call."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from tests.mcp.conftest import (
    TOOL,
    TOOLS,
    Agents,
    McpServer,
    arguments,
    http_session,
)


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"deeper": value}
    return value


def _without(path: tuple[str, ...]) -> Callable[[dict[str, Any]], None]:
    def change(call: dict[str, Any]) -> None:
        *parents, last = path
        node = call
        for name in parents:
            node = node[name]
        del node[last]

    return change


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(call: dict[str, Any]) -> None:
        *parents, last = path
        node = call
        for name in parents:
            node = node[name]
        node[last] = value

    return change


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        (_without(("idempotency_key",)), "idempotency_key"),
        (_without(("fields", "plan")), "fields.plan"),
        (_without(("fields", "email", "source")), "fields.email.source"),
        (_set(("idempotency_key",), 42), "idempotency_key"),
        (_set(("object",), "issue-1042"), "object"),
        (_set(("fields", "email", "read_at"), "yesterday"), "fields.email.read_at"),
        (
            _set(("fields", "email", "read_at"), "2026-01-01T10:00:00"),
            "fields.email.read_at",
        ),
        (_set(("surprise",), True), "surprise"),
        (_set(("arguments",), {"note": "x" * 1_000_000}), "arguments"),
        (_set(("arguments",), _nested(200)), "arguments"),
        (_set(("arguments",), {"n": 2**60}), "arguments"),
    ],
    ids=[
        "missing-key",
        "missing-field",
        "field-without-source",
        "mistyped-key",
        "mistyped-object",
        "read-at-not-a-time",
        "read-at-without-zone",
        "unknown-argument",
        "one-megabyte",
        "nested-200-deep",
        "unsafe-number",
    ],
)
def test_a_bad_argument_is_a_tool_error_naming_it(
    agents: Agents,
    mcp_http: McpServer,
    change: Callable[[dict[str, Any]], None],
    argument: str,
) -> None:
    call = copy.deepcopy(arguments(agents))
    change(call)

    async def scenario() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            bad = await session.call_tool(TOOL, call)
            listed = await session.list_tools()  # the session goes on
            return bad, listed

    bad, listed = anyio.run(scenario)

    assert bad.is_error
    assert bad.structured_content["code"] == "INVALID_ARGUMENT"
    assert bad.structured_content["argument"] == argument
    assert argument in bad.content[0].text
    assert [tool.name for tool in listed.tools] == TOOLS
    assert agents.world.tickets() == 0


def test_an_unknown_tool_is_a_tool_error(agents: Agents, mcp_http: McpServer) -> None:
    call = arguments(agents)

    async def scenario() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            unknown = await session.call_tool("delete_everything__ticket-desk", call)
            good = await session.call_tool(TOOL, call)
            return unknown, good

    unknown, good = anyio.run(scenario)

    assert unknown.is_error
    assert unknown.structured_content["code"] == "UNKNOWN_TOOL"
    assert unknown.structured_content["argument"] == "name"
    assert "delete_everything__ticket-desk" in unknown.content[0].text
    assert good.structured_content["status"] == "verified", good.content
