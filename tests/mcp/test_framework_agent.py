"""A real agent framework drives the portal over MCP: ``examples/mcp_agent.py``, the
OpenAI Agents SDK's MCP client with a scripted model, against the real MCP server
and the real ticket desk; nothing reaches OpenAI."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import subprocess
import sys
from typing import Any

from agents.mcp import MCPServerStreamableHttp

from portal import services as portal_services
from tasks import services as task_services
from tasks.models import Escalation, Operation, Task
from tests.gateway.conftest import SPEC
from tests.mcp.conftest import REPO, TOOL, VERSION_TOOL, Agents, McpServer

EXAMPLE = REPO / "examples" / "mcp_agent.py"
# A name every model API accepts (OpenAI's and Anthropic's function-name rule).
MODEL_SAFE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def run_example(
    mcp: McpServer, secret: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    # Any OpenAI request would go here and fail: the run must make none.
    env.update(PORTAL_API_KEY=secret, OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--mcp-url", mcp.url, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_sdk_agent_makes_one_ticket_per_issue_and_hands_the_stale_one_over(
    agents: Agents, mcp_http: McpServer
) -> None:
    # Given three issues, the third read ten minutes ago (the contract allows 300 s)
    # When the SDK's agent works them through the portal's MCP tools, twice
    first = run_example(mcp_http, agents.secret, "--issues", "3", "--stale-issue", "3")
    second = run_example(mcp_http, agents.secret, "--issues", "3", "--stale-issue", "3")

    # Then each run ends as planned and says what the portal answered
    for run in (first, second):
        assert run.returncode == 0, run.stdout + run.stderr
        out = run.stdout
        assert out.count(f"tools called: {VERSION_TOOL}, {TOOL}") == 3, out
        assert re.search(r"issue-1: verified, ticket \S+", out), out
        assert re.search(r"issue-2: verified, ticket \S+", out), out
        assert re.search(r"issue-3: (refused|human_required): FIELD_STALE", out), out
        assert "done: 3 as planned, 0 failed" in out
        assert "Traceback" not in run.stderr, run.stderr
    # One ticket per fresh issue, none for the stale one, none more on the rerun
    assert agents.world.tickets("ticket-for-issue-1") == 1
    assert agents.world.tickets("ticket-for-issue-2") == 1
    assert agents.world.tickets("ticket-for-issue-3") == 0
    assert agents.world.desk.effects()["create_requests"] == 2
    verified = Operation.objects.filter(tenant=agents.tenant, state="verified")
    assert sorted(verified.values_list("idempotency_key", flat=True)) == [
        "ticket-for-issue-1",
        "ticket-for-issue-2",
    ]
    # The stale issue is on the desk: one item, FIELD_STALE, its task with a person
    stale = Operation.objects.get(
        tenant=agents.tenant, idempotency_key="ticket-for-issue-3"
    )
    items = Escalation.objects.filter(tenant=agents.tenant)
    assert [(i.reason_code, i.resolved_at) for i in items] == [("FIELD_STALE", None)]
    assert Task.objects.get(pk=stale.task_id).state == "human_required"
    # The versions the agent recorded over MCP are the ones the fence checked
    assert Task.objects.filter(tenant=agents.tenant).count() == 3


def test_an_issue_that_is_not_handed_over_as_planned_fails_the_run(
    agents: Agents, mcp_http: McpServer
) -> None:
    # Given the stale issue's key already verified with fresh fields
    fresh = run_example(mcp_http, agents.secret, "--issues", "1", "--stale-issue", "0")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr

    # When the same issue is declared the stale one
    stale = run_example(mcp_http, agents.secret, "--issues", "1", "--stale-issue", "1")

    # Then the portal answers the stored outcome (verified, no second ticket) and
    # the example says the issue did not end as planned
    assert stale.returncode == 1, stale.stdout + stale.stderr
    assert "issue-1: verified" in stale.stdout
    assert "issue-1: FAILED: expected human_required or refused" in stale.stdout
    assert agents.world.tickets("ticket-for-issue-1") == 1


def test_every_tool_name_the_sdk_hands_a_model_is_one_model_apis_accept(
    agents: Agents, mcp_http: McpServer
) -> None:
    # Given two contracts writing the desk (a suffix each) and a long target name
    long_target = "crm.accounts/" + "x" * 80
    task_services.contract_create(
        tenant=agents.tenant, key="refunds", spec=SPEC, publish=True
    )
    long_spec: dict[str, Any] = copy.deepcopy(SPEC)
    long_spec["policy"]["write_targets"] = [long_target]
    task_services.contract_create(
        tenant=agents.tenant, key="accounts", spec=long_spec, publish=True
    )
    portal_services.agent_grant(
        agent=agents.world.agent, action="create_ticket", target=long_target
    )

    # When the Agents SDK's own MCP client lists them for the model
    async def listed() -> list[str]:
        portal = MCPServerStreamableHttp(
            params={
                "url": mcp_http.url,
                "headers": {"Authorization": f"Bearer {agents.secret}"},
            },
            client_session_timeout_seconds=30,
        )
        async with portal:
            return [tool.name for tool in await portal.list_tools()]

    names = asyncio.run(listed())

    # Then each matches what OpenAI's and Anthropic's APIs accept (the SDK passes
    # names on as they are), and none is lost to shortening
    assert all(MODEL_SAFE_NAME.match(name) for name in names), names
    assert len(set(names)) == len(names) == 4, names
    assert "create_ticket__ticket-desk__customer-issue" in names
    assert "create_ticket__ticket-desk__refunds" in names
    (long_name,) = [n for n in names if n.startswith("create_ticket__crm_accounts_")]
    assert len(long_name) == 64, long_name
