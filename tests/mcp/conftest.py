"""The real MCP server, its real clients, the real ticket desk.

``mcp_http`` is ``manage.py mcp --http`` as a child process on a free port of
127.0.0.1, serving the test database (rows a test commits, ``transactional_db``);
its log is checked for tracebacks when the module ends. ``stdio_session`` starts
``manage.py mcp --stdio`` through the SDK's own stdio client. The world (contract,
connector to the desk, agent with its grant and key) is the gateway tier's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from mcp_server.tools import RECORD_VERSION_TOOL
from portal.db import db_now
from portal.models import Tenant
from tasks import services as task_services
from tests.fault.harness import database_url
from tests.gateway.conftest import World, make_world
from tests.support.net import free_port
from ticketdesk.harness import TicketDesk

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
TOOL = "create_ticket__ticket-desk"
# Every agent also has the object-version tool; TOOLS is what a granted agent lists.
VERSION_TOOL = RECORD_VERSION_TOOL
TOOLS = [TOOL, VERSION_TOOL]
_LISTENING = re.compile(r"mcp listening on (?P<url>http://\S+)")


@dataclass
class McpServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    env.update(
        DATABASE_URL=database_url(),
        PORTAL_DEV_MODE="1",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def start_http(log_path: Path, **env: str) -> McpServer:
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "mcp", "--http", "--port", str(port)],
            cwd=REPO,
            env=server_env(**env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = McpServer(url="", process=process, log_path=log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"manage.py mcp exited:\n{server.log()}")
        if match := _LISTENING.search(server.log()):
            server.url = match["url"]
            return server
        time.sleep(0.1)
    stop(server)
    raise RuntimeError(f"manage.py mcp did not listen:\n{server.log()}")


def stop(server: McpServer) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


@pytest.fixture(scope="module")
def mcp_http(
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
    ticketdesk_server: TicketDesk,
) -> Iterator[McpServer]:
    running = start_http(
        tmp_path_factory.mktemp("mcp") / "server.log",
        # The gateway in that process may call the test's desk (tasks/outbound.py).
        PORTAL_OUTBOUND_ALLOWED_HOSTS=urlsplit(ticketdesk_server.url).netloc,
    )
    try:
        yield running
    finally:
        stop(running)
    # A traceback in the log is a call the server did not handle.
    assert "Traceback" not in running.log(), running.log()[-5000:]


@dataclass
class Agents:
    """The gateway tier's world, seen from MCP: the granted agent's key."""

    world: World
    secret: str

    @property
    def tenant(self) -> Tenant:
        return self.world.tenant


@pytest.fixture
def agents(
    transactional_db: None, desk: TicketDesk, tenant: Tenant, make_agent: Any
) -> Iterator[Agents]:
    # make_world's REST client is not used here: the MCP server is the door.
    for world in make_world(
        tenant=tenant, make_agent=make_agent, desk=desk, base_url="http://127.0.0.1:9"
    ):
        secret = world.http.headers["Authorization"].removeprefix("Bearer ")
        yield Agents(world=world, secret=secret)


def arguments(
    agents: Agents, n: int = 1042, *, key: str | None = None, **field_overrides: Any
) -> dict[str, Any]:
    """A tool call's arguments: fresh, correctly sourced fields unless overridden
    (``email={"read_at": ...}``; None drops the field). Records the issue's current
    version (7), the one the arguments say was read."""
    task_services.object_version_record(
        tenant=agents.tenant,
        object_type="customer_issue",
        object_id=str(n),
        version="7",
    )
    now = db_now().isoformat()
    fields: dict[str, Any] = {
        "email": {"value": "ana@example.com", "source": "crm", "read_at": now},
        "plan": {"value": "pro", "source": "billing", "read_at": now},
    }
    for name, change in field_overrides.items():
        if change is None:
            fields.pop(name)
        else:
            fields[name] = {**fields[name], **change}
    return {
        "idempotency_key": key or f"ticket-for-issue-{n}",
        "object": {"type": "customer_issue", "id": str(n), "version": "7"},
        "fields": fields,
        "arguments": {"queue": "billing", "summary": f"Refund for issue {n}"},
    }


@contextlib.asynccontextmanager
async def http_session(
    url: str, secret: str, *, source: str | None = None
) -> AsyncIterator[ClientSession]:
    """The SDK's own client over streamable HTTP, the key as Bearer token;
    ``source``: the local address it connects from (any of 127.0.0.0/8)."""
    transport = httpx2.AsyncHTTPTransport(local_address=source) if source else None
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {secret}"},
            timeout=60,
            transport=transport,
        ) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def stdio_session(secret: str) -> AsyncIterator[ClientSession]:
    """The SDK's own client over stdio: it starts ``manage.py mcp --stdio``."""
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "mcp", "--stdio"],
        cwd=str(REPO),
        env=server_env(PORTAL_API_KEY=secret),
    )
    async with (
        stdio_client(parameters) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def raw_post(
    url: str,
    secret: str | None,
    body: Any,
    *,
    source: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """One JSON-RPC POST, as no SDK would send it (headers, body of our choosing);
    ``source``: the local address it connects from (any of 127.0.0.0/8)."""
    headers = {"Accept": "application/json, text/event-stream", **(headers or {})}
    if secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    if source is None:
        return httpx.post(url, json=body, headers=headers, timeout=30)
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as client:
        return client.post(url, json=body, headers=headers)
