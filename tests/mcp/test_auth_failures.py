"""Bursts of invalid keys at the MCP door are throttled per source address and per
key prefix (issue 25, S07), by the REST API's throttle (``portal.api``'s
``auth_failure_*``): the same counters in PostgreSQL, the same 429 problem+json
``RATE_LIMITED`` with ``Retry-After``, the same log line without key material.

Each test starts its own ``manage.py mcp --http`` with a low limit
(``PORTAL_AUTH_FAILURE_LIMIT``) and one process: a blocked address is remembered in
the process that counted the failure over the limit (another process learns it from
its own next failure, as the REST API's web processes do: docs/limits.md), and the
module's shared server must not inherit a block. Clients connect from distinct
loopback addresses (127.0.0.x: the server sees each as its source).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.db import connection

from audit.models import Event
from portal import scope
from portal import services as portal_services
from portal.models import AgentKey
from tests.mcp.conftest import (
    TOOLS,
    Agents,
    McpServer,
    http_session,
    raw_post,
    start_http,
    stop,
)
from tests.mcp.test_auth import INITIALIZE

LIMIT = 3


@pytest.fixture
def throttled_server(transactional_db: None, tmp_path: Path) -> Iterator[McpServer]:
    server = start_http(
        tmp_path / "server.log",
        PORTAL_AUTH_FAILURE_LIMIT=f"{LIMIT}/min",
        PORTAL_MCP_PROCESSES="1",
    )
    try:
        yield server
    finally:
        stop(server)
    assert "Traceback" not in server.log(), server.log()[-5000:]


def _listed(url: str, secret: str, source: str) -> list[str] | str:
    """The tools the real SDK client lists, or how its connection was refused."""

    async def scenario() -> list[str]:
        async with http_session(url, secret, source=source) as session:
            return [tool.name for tool in (await session.list_tools()).tools]

    try:
        return anyio.run(scenario)
    except Exception as error:  # the transport's refusal  # noqa: BLE001
        return repr(error)


def _windows() -> dict[str, int]:
    """The throttle's counters in PostgreSQL: bucket -> failures in its window."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT bucket, failures FROM portal_authfailurewindow")
        return {str(bucket): int(n) for bucket, n in cursor.fetchall()}


def _assert_throttled(answer: Any) -> None:
    assert answer.status_code == 429, answer.text
    assert answer.headers["Content-Type"] == "application/problem+json"
    body = answer.json()
    assert (body["code"], body["status"]) == ("RATE_LIMITED", 429)
    assert 1 <= int(answer.headers["Retry-After"]) <= 60
    assert body["retry_after_s"] == int(answer.headers["Retry-After"])


def test_an_address_over_the_limit_is_refused_even_with_a_right_key(
    agents: Agents, throttled_server: McpServer
) -> None:
    url = throttled_server.url
    # Given LIMIT failed authentications from one address, each naming another
    # address in X-Forwarded-For (not believed: the address is the socket's)
    first = [
        raw_post(
            url,
            f"nope{i}.guess-{i}",
            INITIALIZE,
            source="127.0.0.7",
            headers={"X-Forwarded-For": f"198.51.100.{i}"},
        )
        for i in range(LIMIT)
    ]
    assert [a.status_code for a in first] == [401] * LIMIT
    assert _windows()["addr:127.0.0.7"] == LIMIT
    # When it fails once more, then comes with the right key (raw, then the SDK)
    over = raw_post(url, "nope.again", INITIALIZE, source="127.0.0.7")
    right = raw_post(url, agents.secret, INITIALIZE, source="127.0.0.7")
    sdk = _listed(url, agents.secret, "127.0.0.7")
    # Then the failure over the limit and the right key are both 429 problems
    _assert_throttled(over)
    _assert_throttled(right)
    # (the SDK's client reports the transport's refusal as an error response; the
    # raw request beside it shows the status the server sent)
    assert isinstance(sdk, str) and "Server returned an error response" in sdk, sdk
    # And the blocked requests were refused before any count (the block is in the
    # server's memory): the counter stands at the failure that went over
    assert _windows()["addr:127.0.0.7"] == LIMIT + 1
    # While the real SDK client with the right key from another address is served
    assert _listed(url, agents.secret, "127.0.0.8") == TOOLS
    # And the failures were logged, without the secrets sent
    log = throttled_server.log()
    assert log.count("API authentication failed") == LIMIT + 1
    assert "guess-" not in log and "again" not in log
    assert agents.secret.partition(".")[2] not in log


def test_a_prefix_over_the_limit_is_429_but_its_agent_keeps_working(
    agents: Agents, throttled_server: McpServer
) -> None:
    """Throttled by prefix, not locked out by it: anyone may know a key's prefix."""
    url = throttled_server.url
    prefix = agents.secret.partition(".")[0]
    # Given wrong secrets for the agent's real prefix, each from another address
    answers = [
        raw_post(url, f"{prefix}.wrong-{i}", INITIALIZE, source=f"127.0.0.{20 + i}")
        for i in range(LIMIT + 1)
    ]
    # Then the failures past the limit are 429, the ones before 401
    assert [a.status_code for a in answers] == [401] * LIMIT + [429]
    _assert_throttled(answers[-1])
    assert _windows()[f"prefix:{prefix}"] == LIMIT + 1
    # And the agent with its right key, from a fresh address, is served
    assert _listed(url, agents.secret, "127.0.0.40") == TOOLS


def _refusals(agents: Agents) -> list[dict[str, Any]]:
    with scope.tenant_scope([agents.tenant.pk]):
        events = Event.objects.filter(tenant=agents.tenant, code="agent_key.refused")
        return [event.payload for event in events.order_by("id")]


def test_a_revoked_key_burst_is_recorded_in_its_tenant_until_throttled(
    agents: Agents, throttled_server: McpServer
) -> None:
    """The exact secret of a revoked key is in someone's hands: each request that
    reached the key lookup is written in its tenant (``agent_key.refused``); once
    the address is blocked, the requests are refused before any lookup and nothing
    more is written. At this door the request that goes over the limit was looked
    up before it was counted (the bearer check answers 401 first), so it is
    recorded too; the REST door counts before its handler records."""
    url = throttled_server.url
    prefix = agents.secret.partition(".")[0]
    with scope.tenant_scope([agents.tenant.pk]):
        portal_services.agent_key_revoke(key=AgentKey.objects.get(prefix=prefix))
    statuses = [
        raw_post(url, agents.secret, INITIALIZE, source="127.0.0.9").status_code
        for _ in range(LIMIT + 3)
    ]
    assert statuses == [401] * LIMIT + [429] * 3
    refusals = _refusals(agents)
    assert len(refusals) == LIMIT + 1
    assert {
        (p["code"], p["key_prefix"], p["status"], p["address"], p["path"])
        for p in refusals
    } == {("API_KEY_REVOKED", prefix, "revoked", "127.0.0.9", "/mcp")}
    assert agents.secret.partition(".")[2] not in str(refusals)
