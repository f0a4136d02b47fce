"""The policy matrix through the MCP tools (issue 21): the SDK's own ClientSession
over streamable HTTP against ``manage.py mcp --http``, the real ticket desk.

Allow; default deny and forbid wins (``POLICY_DENIED`` naming the version and the
determining policy, nothing stored); an ``@approval`` (``APPROVAL_REQUIRED``: the
desk item and the approval it waits for, "do not retry with a new key", and the
same call again still waits); a set that errors when evaluated (``POLICY_ERROR``,
refused, never let through). tests/api/test_policies.py is the same matrix over
REST.
"""

from __future__ import annotations

import json
from typing import Any

import anyio

from audit.models import Event, EventCode
from tasks.models import Approval, Operation
from tests.api.test_policies import (
    BIG_REFUNDS,
    BROKEN,
    NOT_BILLING,
    PERMIT_ALL,
    force_in,
    publish,
)
from tests.mcp.conftest import TOOL, Agents, McpServer, arguments, http_session


def call(mcp_http: McpServer, agents: Agents, *calls: dict[str, Any]) -> list[Any]:
    """Each call in one session, in order; the results."""

    async def scenario() -> list[Any]:
        async with http_session(mcp_http.url, agents.secret) as session:
            return [await session.call_tool(TOOL, one) for one in calls]

    return anyio.run(scenario)


def refused_at_reserve(result: Any, code: str) -> dict[str, Any]:
    """A reservation the policies refused: a tool error the model can read."""
    assert result.is_error, result.content
    found = result.structured_content
    assert found["code"] == code, found
    assert code in result.content[0].text
    return found["details"]["policy"]


def test_a_permit_allows_and_the_reservation_names_the_decision(
    agents: Agents, mcp_http: McpServer
) -> None:
    version = publish(agents.world, PERMIT_ALL)
    [result] = call(mcp_http, agents, arguments(agents, key="ticket-allowed"))
    found = result.structured_content
    assert found["status"] == "verified", result.content
    reserved = Event.objects.get(
        operation_id=found["operation_id"], code=EventCode.OPERATION_RESERVED
    )
    assert reserved.payload["policy"]["verdict"] == "allow"
    assert reserved.payload["policy"]["version"] == version
    assert agents.world.tickets("ticket-allowed") == 1


def test_no_matching_permit_is_policy_denied_and_nothing_is_stored(
    agents: Agents, mcp_http: McpServer
) -> None:
    version = publish(
        agents.world, 'permit(principal, action, resource in Target::"crm");'
    )
    [result] = call(mcp_http, agents, arguments(agents, key="ticket-denied"))
    policy = refused_at_reserve(result, "POLICY_DENIED")
    assert (policy["verdict"], policy["version"]) == ("deny", version)
    assert policy["determining"] == []  # default deny: no policy decided it
    assert not Operation.objects.filter(tenant=agents.tenant).exists()
    assert agents.world.desk.effects()["create_requests"] == 0


def test_a_forbid_wins_over_a_permit_and_is_named(
    agents: Agents, mcp_http: McpServer
) -> None:
    publish(agents.world, PERMIT_ALL + NOT_BILLING)
    sales = arguments(agents, 1043, key="ticket-sales")
    sales["arguments"]["queue"] = "sales"
    billing, other = call(
        mcp_http, agents, arguments(agents, key="ticket-billing"), sales
    )
    policy = refused_at_reserve(billing, "POLICY_DENIED")
    assert policy["determining"] == ["no-billing-tickets"]
    assert other.structured_content["status"] == "verified", other.content
    assert agents.world.tickets("ticket-billing") == 0
    assert agents.world.tickets("ticket-sales") == 1


def test_an_approval_policy_answers_approval_required_with_its_references(
    agents: Agents, mcp_http: McpServer
) -> None:
    publish(agents.world, PERMIT_ALL + BIG_REFUNDS)
    big = arguments(agents, key="refund-900")
    big["arguments"]["amount"] = 900
    small = arguments(agents, 1044, key="refund-100")
    small["arguments"]["amount"] = 100

    async def scenario() -> tuple[Any, Any, Any, Any]:
        async with http_session(mcp_http.url, agents.secret) as session:
            waiting = await session.call_tool(TOOL, big)
            item = await session.read_resource(
                waiting.structured_content["resources"]["desk_item"]
            )
            again = await session.call_tool(TOOL, big)  # the same call, same key
            through = await session.call_tool(TOOL, small)
            return waiting, item, again, through

    waiting, item, again, through = anyio.run(scenario)

    assert not waiting.is_error  # the action's answer, not a tool error
    found = waiting.structured_content
    assert (found["status"], found["reason_code"]) == ("refused", "APPROVAL_REQUIRED")
    assert found["failed_check"] == "policy"
    assert found["desk_item_id"]
    text = waiting.content[0].text
    assert "APPROVAL_REQUIRED" in text and "do not retry with a new key" in text.lower()
    approval = Approval.objects.get(operation_id=found["operation_id"])
    assert (approval.state, approval.quorum, approval.groups) == (
        "waiting",
        2,
        ["finance"],
    )
    # The answer names the approval it waits for, as the desk item does.
    assert found["details"]["approval"]["approval_id"] == str(approval.pk)
    assert f"Approval: {approval.pk}" in text
    desk_item = json.loads(item.contents[0].text)
    assert desk_item["reason_code"] == "APPROVAL_REQUIRED"
    # Asking again under the same key is answered, not run: it still waits.
    assert again.structured_content["operation_id"] == found["operation_id"]
    assert again.structured_content["reason_code"] == "APPROVAL_REQUIRED"
    assert Approval.objects.filter(operation_id=found["operation_id"]).count() == 1
    assert agents.world.tickets("refund-900") == 0
    # The agent's other call needs nobody.
    assert through.structured_content["status"] == "verified", through.content
    assert agents.world.tickets("refund-100") == 1


def test_a_set_that_errors_when_evaluated_refuses_the_call(
    agents: Agents, mcp_http: McpServer
) -> None:
    force_in(agents.world, PERMIT_ALL + BROKEN)
    [result] = call(mcp_http, agents, arguments(agents, key="ticket-broken"))
    policy = refused_at_reserve(result, "POLICY_ERROR")
    assert policy["verdict"] == "error" and policy["error"]
    assert not Operation.objects.filter(tenant=agents.tenant).exists()
    assert agents.world.desk.effects()["create_requests"] == 0
