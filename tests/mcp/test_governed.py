"""Tool calls are governed actions: one ticket per key whatever the clients do, a
person's turn or an unknown outcome says to wait, and every answer is one the
agent can act on. The SDK's own client over streamable HTTP, the real desk."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import anyio
import mcp_types as types
from django.db import connection

from portal import services as portal_services
from portal.db import db_now
from portal.models import Tenant
from tasks.jobs import check_receipts_job
from tasks.models import Escalation, Operation, Task
from tests.mcp.conftest import (
    TOOL,
    VERSION_TOOL,
    Agents,
    McpServer,
    arguments,
    http_session,
)


def _resource(result: Any) -> dict[str, Any]:
    return json.loads(result.contents[0].text)


def test_a_stale_field_is_field_stale_with_a_desk_item_to_read(
    agents: Agents, mcp_http: McpServer
) -> None:
    stale = (db_now() - dt.timedelta(minutes=10)).isoformat()
    call = arguments(agents, key="ticket-stale", email={"read_at": stale})

    async def scenario() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            answer = await session.call_tool(TOOL, call)
            item = await session.read_resource(
                answer.structured_content["resources"]["desk_item"]
            )
            story = await session.read_resource(
                answer.structured_content["resources"]["story"]
            )
            return answer, item, story

    answer, item, story = anyio.run(scenario)

    # The action's answer, not a tool error: the agent must act on it.
    assert not answer.is_error
    found = answer.structured_content
    assert (found["status"], found["reason_code"]) == ("refused", "FIELD_STALE")
    assert found["failed_fields"] == ["email"]
    assert "do not retry with a new key" in answer.content[0].text.lower()
    assert Escalation.objects.get(pk=found["desk_item_id"]).reason_code == "FIELD_STALE"
    desk_item = _resource(item)
    assert desk_item["reason_code"] == "FIELD_STALE"
    assert (desk_item["resolved"], desk_item["task_state"]) == (False, "human_required")
    events = _resource(story)["events"]
    assert events and {e["task_id"] for e in events} == {found["task_id"]}
    assert "ana@example.com" not in story.contents[0].text  # redacted
    assert agents.world.tickets() == 0


def test_a_dropped_answer_is_unknown_and_recovery_makes_no_second_ticket(
    agents: Agents, mcp_http: McpServer
) -> None:
    agents.world.desk.set_fault("execute_then_drop")  # made, its answer lost
    agents.world.desk.set_fault("lookup_5xx")  # and the first look cannot tell
    call = arguments(agents, key="ticket-dropped")

    async def call_once() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            return await session.call_tool(TOOL, call)

    first = anyio.run(call_once)
    assert first.structured_content["status"] == "unknown", first.content
    assert "do not retry with a new key" in first.content[0].text.lower()
    # The portal's recovery looks the receipt up by key.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    assert check_receipts_job() == 1
    operation = Operation.objects.get(pk=first.structured_content["operation_id"])
    assert operation.state == "verified"

    again = anyio.run(call_once)

    assert again.structured_content["status"] == "verified", again.content
    assert again.structured_content["operation_id"] == str(operation.pk)
    assert agents.world.tickets("ticket-dropped") == 1
    assert agents.world.desk.effects()["create_requests"] == 1


def test_eight_clients_calling_one_key_at_once_make_one_ticket(
    agents: Agents, mcp_http: McpServer
) -> None:
    call = arguments(agents, key="ticket-eight")
    answers: list[dict[str, Any]] = []

    async def client() -> None:
        async with http_session(mcp_http.url, agents.secret) as session:
            for _ in range(200):
                result = await session.call_tool(TOOL, call)
                found = result.structured_content
                if found.get("code") != "REQUEST_IN_FLIGHT":
                    answers.append(found)
                    return
                # What the answer says: the same call again, shortly.
                text = result.content[0]
                assert isinstance(text, types.TextContent)
                assert "do not use a new key" in text.text
                await anyio.sleep(0.05)
            raise AssertionError("still in flight")

    async def scenario() -> None:
        async with anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(client)

    anyio.run(scenario)

    assert len(answers) == 8
    assert {(a["status"], a["operation_id"], a["receipt"]) for a in answers} == {
        ("verified", answers[0]["operation_id"], answers[0]["receipt"])
    }
    assert agents.world.tickets("ticket-eight") == 1
    assert agents.world.desk.effects()["create_requests"] == 1
    assert Task.objects.filter(tenant=agents.tenant).count() == 1


def test_another_agent_sees_only_its_own_grants_and_another_tenant_nothing(
    agents: Agents, mcp_http: McpServer, make_agent: Any, make_tenant: Any
) -> None:
    # Given this tenant's agent with no grant and another tenant's agent with one
    ungranted = make_agent(tenant=agents.tenant, grants=())
    ungranted_key = portal_services.agent_key_issue(agent=ungranted).secret
    elsewhere: Tenant = make_tenant()
    stranger = make_agent(tenant=elsewhere, grants=("create_ticket",))
    stranger_key = portal_services.agent_key_issue(agent=stranger).secret
    call = arguments(agents, key="ticket-mine")

    async def scenario() -> Any:
        async with http_session(mcp_http.url, agents.secret) as session:
            mine = await session.call_tool(TOOL, call)
        story_uri = mine.structured_content["resources"]["story"]
        seen = {}
        for name, key in (("ungranted", ungranted_key), ("stranger", stranger_key)):
            async with http_session(mcp_http.url, key) as session:
                tools = await session.list_tools()
                called = await session.call_tool(TOOL, call)
                try:
                    await session.read_resource(story_uri)
                    story = "read"
                except Exception as error:  # the SDK raises the JSON-RPC error  # noqa: BLE001
                    story = str(error)
                seen[name] = (tools, called, story)
        return mine, seen

    mine, seen = anyio.run(scenario)

    assert mine.structured_content["status"] == "verified"
    for name in ("ungranted", "stranger"):
        tools, called, story = seen[name]
        assert [t.name for t in tools.tools] == [VERSION_TOOL], name
        assert called.structured_content["code"] == "UNKNOWN_TOOL", name
        assert "not found" in story.lower(), name
    assert agents.world.tickets() == 1
