"""Example agent on a real agent framework: the OpenAI Agents SDK over MCP.

The same work as ``customer_issue_agent.py`` (each confirmed customer issue becomes
one support ticket), but the agent is the OpenAI Agents SDK's ``Agent``, the portal
is one of its MCP servers (``MCPServerStreamableHttp``: the agent's key as Bearer
token), and the portal's tools are the only tools it has. Run against the portal
that ``python3 manage.py up`` starts (its banner prints the MCP URL and the agent's
key)::

    PORTAL_API_KEY=agp_... .venv/bin/python examples/mcp_agent.py \\
        --mcp-url http://127.0.0.1:8200/mcp --issues 3

The model is ``ScriptedModel``: a stand-in that reads the issue from the prompt and
decides what a model would, with no LLM and no network. It calls
``portal__record_object_version`` (the issue's version, ``7``), then the governed
tool ``create_ticket__ticket-desk`` with the key ``ticket-for-issue-<n>``, the
object, the fields it read (e-mail from the CRM, plan from billing, each with when
it was read) and the ticket's arguments; it repeats the very same call while the
portal says the outcome is ``unknown``, and ends with a line saying what the portal
answered. Swap in any model the SDK supports (``Agent(model="gpt-...")`` with
``OPENAI_API_KEY``, or another provider's ``Model``), and drop
``set_tracing_disabled`` if the traces may go to OpenAI; the portal does not change.

The portal governs each call: the gateway checks the fields against the contract,
calls the ticket desk at most once per key and verifies the receipt. The last issue's
e-mail was read ten minutes ago, longer than the contract's 300 s: the portal
refuses it (``FIELD_STALE``), no ticket is made and a desk item waits for a person.
That is the expected outcome (``--stale-issue 0``: every issue fresh). A second run
repeats the same keys: the portal answers the stored outcomes and the desk makes no
second ticket; the stale issue stays with its person until they settle it. When the
portal answers ``verified`` or ``failed``, the agent reads the task's story (the
``portal://tasks/<id>/story`` resource) to say whether a person settled it.

The last line counts each issue once, as what happened to it on this run (see
``customer_issues.py``): ``done: 2 ticket(s), 1 with a person (issue-3), 0 failed``.
Exit status: 0 when every issue has its verified ticket or is with a person; 1 when
any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agents import (
    Agent,
    FunctionTool,
    ItemHelpers,
    MessageOutputItem,
    ModelResponse,
    ModelSettings,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    Usage,
    set_tracing_disabled,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.mcp import MCPServerStreamableHttp
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from customer_issues import (
    OBJECT_TYPE,
    OBJECT_VERSION,
    QUEUE,
    CustomerIssue,
    Tally,
    add_issue_arguments,
    check_issue_arguments,
    demo_issues,
    say,
)
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

# The portal's tool for ``create_ticket`` on ``ticket-desk`` (docs/mcp.md, "Tools").
TICKET_TOOL: Final = "create_ticket__ticket-desk"
VERSION_TOOL: Final = "portal__record_object_version"
# How often the model repeats the same call while the portal says "unknown".
UNKNOWN_REPEATS: Final = 10
UNKNOWN_WAIT_S: Final = 1.0
WITH_A_PERSON: Final = frozenset({"refused", "human_required"})

INSTRUCTIONS: Final = f"""\
You file one support ticket per confirmed customer issue, through the portal's tools.
First record the issue's current version with {VERSION_TOOL}. Then call
{TICKET_TOOL} once, with the idempotency key ticket-for-issue-<number>, the issue
as the object, the e-mail and plan exactly as you read them (value, source, read_at)
and the queue, summary and customer as arguments. If the answer's status is
"unknown", repeat the very same call later; never make up a new key. Finish with one
line: the portal's status, and the receipt or the reason."""


def prompt(issue: CustomerIssue, now: dt.datetime) -> str:
    """The user turn: the issue and what was read, when (a model reads this)."""
    facts = {
        "number": issue.number,
        "customer": issue.customer,
        "summary": issue.summary,
        "object": {
            "type": OBJECT_TYPE,
            "id": str(issue.number),
            "version": OBJECT_VERSION,
        },
        "read": {
            name: {"value": value, "source": source, "read_at": read_at.isoformat()}
            for name, (value, source, read_at) in issue.reads(now).items()
        },
        "queue": QUEUE,
    }
    return f"A confirmed customer issue:\n```json\n{json.dumps(facts)}\n```"


# --- The stand-in model -----------------------------------------------------------

_FACTS: Final = re.compile(r"```json\n(?P<json>.*?)\n```", re.DOTALL)


class ScriptedModel(Model):
    """A model that decides by script: the SDK's ``Model`` interface, no LLM.

    Each turn it reads the conversation the SDK hands every model (the prompt, its
    own tool calls, the tools' outputs) and answers as a model would: a function
    call, or the final message. It needs the tools the portal listed; a missing one
    ends the run with a message saying so. Only ``get_response`` is scripted:
    ``Runner.run`` uses it; streaming is not.
    """

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
        **_: Any,
    ) -> ModelResponse:
        items = (
            [{"role": "user", "content": input}] if isinstance(input, str) else input
        )
        facts = _facts_of(items)
        calls = [i for i in items if _get(i, "type") == "function_call"]
        outputs = {
            _get(i, "call_id"): _get(i, "output")
            for i in items
            if _get(i, "type") == "function_call_output"
        }
        names = {tool.name for tool in tools if isinstance(tool, FunctionTool)}
        missing = {VERSION_TOOL, TICKET_TOOL} - names
        if missing:
            return _message(f"I cannot do this: no tool {', '.join(sorted(missing))}.")
        if not calls:
            return _call(
                len(items),
                VERSION_TOOL,
                {"object_type": OBJECT_TYPE, **_object_of(facts, key="object_id")},
            )
        ticket_calls = [c for c in calls if _get(c, "name") == TICKET_TOOL]
        if not ticket_calls:
            return _call(len(items), TICKET_TOOL, _ticket_arguments(facts))
        answer = _answer(outputs.get(_get(ticket_calls[-1], "call_id")))
        if answer.get("status") == "unknown" and len(ticket_calls) <= UNKNOWN_REPEATS:
            # What the answer says: the same call again, later, never a new key.
            await asyncio.sleep(UNKNOWN_WAIT_S)
            return _call(
                len(items), TICKET_TOOL, json.loads(_get(ticket_calls[-1], "arguments"))
            )
        return _message(_summary(answer))

    async def stream_response(
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("ScriptedModel is scripted for Runner.run only")
        yield  # an async generator, as the interface declares


def _get(item: Any, name: str) -> Any:
    """A field of a conversation item: the SDK passes dicts and models."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _facts_of(items: Sequence[Any]) -> dict[str, Any]:
    for item in items:
        content = _get(item, "content")
        user_text = _get(item, "role") == "user" and isinstance(content, str)
        if user_text and (found := _FACTS.search(content)):
            facts: dict[str, Any] = json.loads(found["json"])
            return facts
    raise ValueError("the prompt names no customer issue")


def _object_of(facts: dict[str, Any], *, key: str = "id") -> dict[str, str]:
    return {key: facts["object"]["id"], "version": facts["object"]["version"]}


def _ticket_arguments(facts: dict[str, Any]) -> dict[str, Any]:
    return {
        "idempotency_key": f"ticket-for-issue-{facts['number']}",
        "object": {"type": facts["object"]["type"], **_object_of(facts)},
        "fields": facts["read"],
        # The desk's input: queue, summary, customer (it refuses members it does
        # not know; the gateway adds the object and the fields itself).
        "arguments": {
            "queue": facts["queue"],
            "summary": facts["summary"],
            "customer": facts["customer"],
        },
    }


def _answer(output: Any) -> dict[str, Any]:
    """The portal's structured answer; a tool error arrives as text, kept whole."""
    try:
        answer = json.loads(output)
    except (TypeError, ValueError):
        return {"status": "error", "next_step": str(output)}
    return answer if isinstance(answer, dict) else {"status": "error"}


def _summary(answer: dict[str, Any]) -> str:
    said = answer.get("receipt") or answer.get("reason_code") or answer.get("code")
    return f"The portal answered {answer.get('status')}: {said}."


def _call(turn: int, name: str, arguments: dict[str, Any]) -> ModelResponse:
    call = ResponseFunctionToolCall(
        type="function_call",
        id=f"fc_{turn}",
        call_id=f"call_{turn}",
        name=name,
        arguments=json.dumps(arguments),
        status="completed",
    )
    return ModelResponse(output=[call], usage=Usage(requests=1), response_id=None)


def _message(text: str) -> ModelResponse:
    message = ResponseOutputMessage(
        type="message",
        id="msg_final",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )
    return ModelResponse(output=[message], usage=Usage(requests=1), response_id=None)


# --- The run --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the portal answered the issue's governed call, and the model's line."""

    answer: dict[str, Any]
    calls: list[str]
    final: str


async def handle(agent: Agent[None], issue: CustomerIssue) -> Outcome:
    """One run of the agent for one issue: its tool calls, the portal's answers."""
    result = await Runner.run(agent, prompt(issue, dt.datetime.now(dt.UTC)))
    names: dict[str, str] = {}
    calls: list[str] = []
    answer: dict[str, Any] = {"status": "error", "next_step": "no ticket call made"}
    for item in result.new_items:
        if isinstance(item, ToolCallItem):
            raw = item.raw_item
            name, call_id = _get(raw, "name"), _get(raw, "call_id")
            names[call_id] = name
            calls.append(name)
        elif (
            isinstance(item, ToolCallOutputItem)
            and names.get(_get(item.raw_item, "call_id")) == TICKET_TOOL
        ):
            answer = _answer(item.output)
    final = next(
        (
            ItemHelpers.text_message_output(item)
            for item in reversed(result.new_items)
            if isinstance(item, MessageOutputItem)
        ),
        "",
    )
    return Outcome(answer=answer, calls=calls, final=final)


async def resolved_by_person(portal: MCPServerStreamableHttp, story: str) -> bool:
    """Whether a person settled or handed back the task (its story says so)."""
    read = await portal.read_resource(story)
    text = next((c.text for c in read.contents if hasattr(c, "text")), "{}")
    return any(
        event.get("code") == "task.resolved" and event.get("actor_type") == "user"
        for event in json.loads(text).get("events", [])
    )


async def report(
    portal: MCPServerStreamableHttp,
    issue: CustomerIssue,
    outcome: Outcome,
    tally: Tally,
) -> None:
    """Print what the portal answered; tally what happened to the issue."""
    name = issue.name
    answer = outcome.answer
    status = answer.get("status")
    story = (answer.get("resources") or {}).get("story")
    by_person = False
    if status in ("verified", "failed") and isinstance(story, str):
        by_person = await resolved_by_person(portal, story)
    say(f"{name}: tools called: {', '.join(outcome.calls) or 'none'}")
    if status == "verified":
        say(f"{name}: verified, ticket {answer['receipt']} (task {answer['task_id']})")
        tally.ticket(name, after_person=by_person)
    elif status in WITH_A_PERSON:
        say(
            f"{name}: {status}: {answer.get('reason_code')} "
            f"(fields {', '.join(answer.get('failed_fields') or []) or 'none'}); "
            f"desk item {answer.get('desk_item_id')}: a person has it"
        )
        tally.person(name)
    elif status == "failed" and by_person:
        say(f"{name}: settled by a person ({answer.get('task_state')})")
        tally.person(name, settled=answer.get("task_state"))
    else:
        tally.fail(
            name, f"{status}: {answer.get('code') or ''} {answer.get('next_step')}"
        )
    say(f"{name}: model: {outcome.final}")


async def run(args: argparse.Namespace) -> int:
    # The SDK's tracing exports to OpenAI; this example sends nothing anywhere but
    # the portal.
    set_tracing_disabled(True)
    issues = demo_issues(args.issues, stale_issue=args.stale_issue)
    say(f"mcp agent (OpenAI Agents SDK, scripted model): {args.issues} issue(s)")
    portal = MCPServerStreamableHttp(
        params={
            "url": args.mcp_url,
            "headers": {"Authorization": f"Bearer {args.api_key}"},
            "timeout": 60,
        },
        name="portal",
        # The portal's tools answer structured content: the model reads that JSON.
        use_structured_content=True,
        cache_tools_list=True,
        client_session_timeout_seconds=60,
    )
    tally = Tally()
    async with portal:
        agent: Agent[None] = Agent(
            name="customer-issue-agent",
            instructions=INSTRUCTIONS,
            # A model instance, not a name: the SDK creates no OpenAI client.
            model=ScriptedModel(),
            mcp_servers=[portal],
        )
        for issue in issues:
            if issue.stale:
                say(
                    f"{issue.name}: e-mail read "
                    f"{issue.email_age.total_seconds():.0f} s ago (the contract "
                    "allows 300 s): expect the portal to hand it to a person"
                )
            await report(portal, issue, await handle(agent, issue), tally)
    say(tally.summary())
    return tally.exit_status(issues)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mcp-url", default="http://127.0.0.1:8200/mcp")
    add_issue_arguments(parser)
    args = parser.parse_args(argv)
    args.api_key = os.environ.get("PORTAL_API_KEY")
    if not args.api_key:
        parser.error("PORTAL_API_KEY (the agent's key) is required")
    check_issue_arguments(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
