"""A client nobody here wrote: the TypeScript SDK's (``@modelcontextprotocol/sdk``,
pinned in tests/mcp/ts/package-lock.json) lists and calls the tool over streamable
HTTP, with the machine's Node.js."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.mcp.conftest import TOOL, TOOLS, Agents, McpServer, arguments

TS = Path(__file__).resolve().parent / "ts"


@pytest.fixture(scope="session")
def node() -> str:
    """``node``, with the client's packages installed from the lock file."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js (node and npm) is not installed on this machine")
    if not (TS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=TS,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return node


def test_the_typescript_sdk_lists_and_calls_the_tool(
    agents: Agents, mcp_http: McpServer, node: str
) -> None:
    call = arguments(agents, key="ticket-from-typescript")
    done = subprocess.run(
        [node, "client.mjs", mcp_http.url],
        cwd=TS,
        env={
            "PATH": str(Path(node).parent),
            "MCP_KEY": agents.secret,
            "MCP_TOOL": TOOL,
            "MCP_ARGUMENTS": json.dumps(call),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)

    assert answer["tools"] == TOOLS
    result = answer["result"]
    assert result.get("isError") is not True, result
    assert result["structuredContent"]["status"] == "verified"
    assert result["structuredContent"]["receipt"]
    assert "verified" in result["content"][0]["text"]
    assert agents.world.tickets("ticket-from-typescript") == 1
