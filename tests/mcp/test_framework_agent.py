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

import pytest
from agents.mcp import MCPServerStreamableHttp
from django.contrib.auth.models import User

from portal import services as portal_services
from portal.db import db_now
from portal.models import Role
from tasks import services as task_services
from tasks import takeover
from tasks.gateway import FieldValue
from tasks.models import Escalation, Operation, Task
from tests.mcp.conftest import REPO, TOOL, VERSION_TOOL, Agents, McpServer
from tests.support.contracts import SPEC

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
        assert "done: 2 ticket(s), 1 with a person (issue-3), 0 failed" in out
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


def test_an_issue_counts_as_what_happened_not_as_planned(
    agents: Agents, mcp_http: McpServer
) -> None:
    # Given the stale issue's key already verified with fresh fields
    fresh = run_example(mcp_http, agents.secret, "--issues", "1", "--stale-issue", "0")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr

    # When the same issue is declared the stale one
    stale = run_example(mcp_http, agents.secret, "--issues", "1", "--stale-issue", "1")

    # Then the portal answers the stored outcome (verified, no second ticket) and
    # the run counts it as the ticket it has
    assert stale.returncode == 0, stale.stdout + stale.stderr
    assert "issue-1: verified" in stale.stdout
    assert "done: 1 ticket(s), 0 with a person (none), 0 failed" in stale.stdout
    assert agents.world.tickets("ticket-for-issue-1") == 1


def _support_settles_the_stale_issue(agents: Agents, how: str) -> None:
    """A support person claims issue-1 on the desk and settles it (``how``)."""
    person = User.objects.create_user("sam", password="pw-for-tests-only-1")
    portal_services.membership_grant(
        tenant=agents.tenant, user=person, role=Role.SUPPORT
    )
    operation = Operation.objects.get(
        tenant=agents.tenant, idempotency_key="ticket-for-issue-1"
    )
    task = Task.objects.get(pk=operation.task_id)
    takeover.task_human_claim(task=task, user=person)
    if how == "edit":
        fresh = [
            FieldValue(name=name, value=value, source=source, observed_at=db_now())
            for name, value, source in (
                ("email", "customer1@example.com", "crm"),
                ("plan", "pro", "billing"),
            )
        ]
        edited = takeover.task_human_edit(
            task=task, user=person, operation_id=operation.pk, fields=fresh
        )
        assert edited.result.outcome == "verified"
    else:
        takeover.task_human_resolve(
            task=task, user=person, resolution=how, note="duplicate issue"
        )


@pytest.mark.parametrize(
    ("how", "summary"),
    [
        ("edit", "done: 1 ticket(s) (issue-1 after a person), 0 with a person"),
        ("cancel", "done: 0 ticket(s), 1 with a person (issue-1 cancelled by a"),
    ],
)
def test_every_run_after_a_person_settled_the_issue_says_so(
    agents: Agents, mcp_http: McpServer, how: str, summary: str
) -> None:
    # Given the stale issue on the desk, settled there by support
    first = run_example(mcp_http, agents.secret, "--issues", "1", "--stale-issue", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    _support_settles_the_stale_issue(agents, how)

    # When the agent runs again, twice, declaring the issue stale or not
    for stale in ("1", "0", "1"):
        again = run_example(
            mcp_http, agents.secret, "--issues", "1", "--stale-issue", stale
        )

        # Then each run says what the person did and exits 0
        assert again.returncode == 0, again.stdout + again.stderr
        assert summary in again.stdout, again.stdout
        assert "FAILED" not in again.stdout
    assert agents.world.tickets("ticket-for-issue-1") == (1 if how == "edit" else 0)


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
