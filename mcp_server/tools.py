"""The caller's grants as MCP tools, each generated from its pinned contract.

One tool per (action, target) the agent is granted and a published contract names
as a write target (``tool_list``); a grant on ``*`` yields one per such target. The
tool's input schema is the contract's: the object, each required field with its
``value``, ``source`` and ``read_at``, the operation's ``arguments`` and the
``idempotency_key``. A call is checked here for shape (``request_of``: a tool error
names the argument) and then is one governed action (``tasks.actions``), which
checks everything else.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

import jsonschema
import mcp_types as types
from rest_framework import serializers

from portal.api_input import CanonicalJsonValueField
from portal.exceptions import PortalError
from portal.models import Agent
from portal.parsers import MAX_DEPTH, json_depth
from tasks import selectors as task_selectors
from tasks.actions import ActionOutcome, ActionRequest, FieldRead
from tasks.models import Contract, ContractStatus

from . import deep, selectors
from .exceptions import BadArgument

# A tool call's arguments, all of them, as JSON: an action's facts are a ticket's,
# not a file's (the REST API's whole-body limit is the web server's, far larger).
MAX_ARGUMENTS_BYTES: Final = 64 * 1024
# What model APIs accept as a function's name: OpenAI's and Anthropic's both demand
# ^[a-zA-Z0-9_-]{1,64}$, and an MCP client hands the tool's name to the model as is
# (the OpenAI Agents SDK does), so a dot in a name breaks the agent's first request.
_NAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
_NAME_SEPARATOR: Final = "__"
_TOOL_NAME_MAX: Final = 64


@dataclasses.dataclass(frozen=True, kw_only=True)
class GovernedTool:
    """One tool: a granted action on a target, under a contract version."""

    name: str
    action: str
    target: str
    contract: Contract

    @property
    def object_type(self) -> str:
        return str(self.contract.spec["object_type"])

    @property
    def required_fields(self) -> list[dict[str, Any]]:
        return list(self.contract.spec["required_fields"])


def _pinned_contracts(*, agent: Agent) -> list[Contract]:
    """The newest published version of each of the tenant's contracts."""
    newest: dict[str, Contract] = {}
    for contract in task_selectors.contract_list(tenant=agent.tenant):
        if contract.status == ContractStatus.PUBLISHED:
            newest[contract.key] = contract  # listed by key, then version
    return list(newest.values())


def _tool_name(*parts: str) -> str:
    """``<action>__<target>[__<contract>]``, safe for every model API.

    A character outside ``[A-Za-z0-9_-]`` becomes ``_``; a name longer than 64
    keeps its first 55 characters and ends in ``-`` and 8 hex digits of the
    SHA-256 of the parts as given, so two long names stay two names, the same in
    every listing.
    """
    name = _NAME_SEPARATOR.join(_NAME_UNSAFE.sub("_", part) for part in parts)
    if len(name) <= _TOOL_NAME_MAX:
        return name
    digest = hashlib.sha256(_NAME_SEPARATOR.join(parts).encode()).hexdigest()[:8]
    return f"{name[: _TOOL_NAME_MAX - 9]}-{digest}"


def tool_list(*, agent: Agent) -> list[GovernedTool]:
    """The agent's tools, by name; run in the agent's tenant scope.

    The name is ``<action>__<target>`` (``_tool_name``); where several contracts
    name the same target for one action, each tool's name ends in
    ``__<contract key>``.
    """
    contracts = _pinned_contracts(agent=agent)
    pairs: list[tuple[str, str, Contract]] = [
        (grant.action, target, contract)
        for grant in selectors.grant_list(tenant=agent.tenant, agent=agent)
        for contract in contracts
        for target in contract.spec["policy"]["write_targets"]
        if grant.target in (target, "*")
    ]
    unique = sorted(
        {(a, t, c.key): (a, t, c) for a, t, c in pairs}.values(),
        key=lambda p: (p[0], p[1], p[2].key),
    )
    per_pair = Counter((a, t) for a, t, _ in unique)
    tools = []
    for action, target, contract in unique:
        parts: tuple[str, ...] = (action, target)
        if per_pair[(action, target)] > 1:
            parts = (action, target, contract.key)
        tools.append(
            GovernedTool(
                name=_tool_name(*parts), action=action, target=target, contract=contract
            )
        )
    return tools


# The one tool that is no governed action: it tells the portal an object's current
# version, as ``PUT /api/v1/object-versions/{type}/{id}`` does over REST, so that an
# MCP-only agent can feed the version fence (a call whose object version the portal
# does not know is refused with VERSION_CONFLICT). The server looks this name up
# first: a governed tool for the action ``portal`` on the target
# ``record_object_version`` would be hidden behind it.
RECORD_VERSION_TOOL: Final = "portal__record_object_version"
RECORD_VERSION_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["object_type", "object_id", "version"],
    "properties": {
        "object_type": {"type": "string", "minLength": 1, "maxLength": 100},
        "object_id": {"type": "string", "minLength": 1, "maxLength": 200},
        "version": {"type": "string", "minLength": 1, "maxLength": 100},
    },
}


def record_version_tool() -> types.Tool:
    """The ``tools/list`` entry of the object-version tool (every agent has it)."""
    return types.Tool(
        name=RECORD_VERSION_TOOL,
        title="Record an object's current version",
        description=(
            "Tell the portal the current version of a business object as you read "
            "it from its system of record. A governed action on that object is "
            "refused (VERSION_CONFLICT) unless the version it says you read is the "
            "one recorded here; record it before the action, not after."
        ),
        input_schema=RECORD_VERSION_SCHEMA,
        annotations=types.ToolAnnotations(
            title="Record an object's current version",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )


def record_version_of(arguments: Any) -> dict[str, str]:
    """The object-version tool's arguments, checked; BadArgument names a bad one."""
    if not isinstance(arguments, Mapping):
        raise BadArgument("arguments", "must be an object")
    errors = sorted(
        jsonschema.Draft202012Validator(RECORD_VERSION_SCHEMA).iter_errors(
            dict(arguments)
        ),
        key=lambda e: list(e.path),
    )
    if errors:
        raise BadArgument(_argument_of(errors[0]), errors[0].message)
    return {name: str(arguments[name]) for name in RECORD_VERSION_SCHEMA["required"]}


def tool_find(*, agent: Agent, name: str) -> GovernedTool | None:
    """The agent's tool of this name; None when it has none."""
    return next((t for t in tool_list(agent=agent) if t.name == name), None)


# --- The tool as MCP sees it ----------------------------------------------------------


def _field_schema(field: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "description": (
            f"The value of {field['name']!r} as read from {field['source']!r}, at "
            f"most {field['max_age_s']} s before the call."
        ),
        "additionalProperties": False,
        "required": ["value", "source", "read_at"],
        "properties": {
            "value": {"description": "The value as read."},
            "source": {
                "type": "string",
                "minLength": 1,
                "description": f"Where it was read; the contract wants "
                f"{field['source']!r}.",
            },
            "read_at": {
                "type": "string",
                "format": "date-time",
                "description": "When it was read (RFC 3339, with a time zone).",
            },
        },
    }


def input_schema(tool: GovernedTool) -> dict[str, Any]:
    """The tool's JSON Schema (2020-12), from its contract."""
    names = [field["name"] for field in tool.required_fields]
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["idempotency_key", "object", "fields", "arguments"],
        "properties": {
            "idempotency_key": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "description": "The side effect's business identity, e.g. "
                "'ticket-for-issue-1042'. Repeating a call with the same key is "
                "safe and answers the same; never make up a new key to retry.",
            },
            "object": {
                "type": "object",
                "description": f"The {tool.object_type} the action is about, and "
                "the version you read.",
                "additionalProperties": False,
                "required": ["id", "version"],
                "properties": {
                    "type": {"const": tool.object_type},
                    "id": {"type": "string", "minLength": 1, "maxLength": 200},
                    "version": {"type": "string", "minLength": 1, "maxLength": 100},
                },
            },
            "fields": {
                "type": "object",
                "description": "Each field the contract requires, with its source "
                "and read time.",
                "additionalProperties": False,
                "required": names,
                "properties": {
                    field["name"]: _field_schema(field)
                    for field in tool.required_fields
                },
            },
            "arguments": {
                "type": "object",
                "description": "The action's input (hashed with the key: the same "
                "key must come with the same arguments).",
            },
        },
    }


OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["status", "next_step"],
    "properties": {
        "status": {
            "enum": [
                "verified",
                "refused",
                "human_required",
                "unknown",
                "accepted",
                "failed",
                "error",
            ]
        },
        "next_step": {"type": "string"},
        "operation_id": {"type": ["string", "null"]},
        "task_id": {"type": ["string", "null"]},
        "operation_state": {"type": ["string", "null"]},
        "task_state": {"type": ["string", "null"]},
        "reason_code": {"type": ["string", "null"]},
        "failed_check": {"type": ["string", "null"]},
        "failed_fields": {"type": "array", "items": {"type": "string"}},
        "receipt": {"type": ["string", "null"]},
        "desk_item_id": {"type": ["string", "null"]},
        "status_url": {"type": ["string", "null"]},
        "resources": {"type": "object"},
        "code": {"type": "string"},
        "argument": {"type": "string"},
        "details": {"type": "object"},
    },
}


def _description(tool: GovernedTool) -> str:
    contract = tool.contract
    fields = ", ".join(
        f"{f['name']} (from {f['source']}, at most {f['max_age_s']} s old)"
        for f in tool.required_fields
    )
    receipt = contract.spec["receipt"]
    proof = f"A receipt ({receipt['type']}) proves it. " if receipt["required"] else ""
    return (
        f"Governed action {tool.action!r} on {tool.target!r} for a "
        f"{tool.object_type}, under contract {contract.key!r} v{contract.version}. "
        f"Required fields: {fields or 'none'}. "
        f"{proof}"
        "The portal checks the fields, your grant and the object's version, calls "
        "the target at most once per idempotency key and verifies the receipt; "
        "anything in doubt goes to a person."
    )


def mcp_tool(tool: GovernedTool) -> types.Tool:
    """The ``tools/list`` entry."""
    return types.Tool(
        name=tool.name,
        title=f"{tool.action} on {tool.target}",
        description=_description(tool),
        input_schema=input_schema(tool),
        output_schema=OUTPUT_SCHEMA,
        annotations=types.ToolAnnotations(
            title=f"{tool.action} on {tool.target}",
            read_only_hint=False,  # the contract names the target as written to
            # The contract does not say the write is additive: the safe claim.
            destructive_hint=True,
            idempotent_hint=True,  # the idempotency key makes it so
            open_world_hint=True,  # a remote system, beyond the portal
        ),
    )


# --- A call's arguments ---------------------------------------------------------------


def _check_limits(arguments: Mapping[str, Any]) -> None:
    for name, value in arguments.items():
        depth = deep.too_deep(value)
        if depth is not None:
            raise BadArgument(
                str(name), f"nests {depth} levels deep; at most {MAX_DEPTH}"
            )
        size = len(json.dumps(value, ensure_ascii=False).encode())
        if size > MAX_ARGUMENTS_BYTES:
            raise BadArgument(
                str(name),
                f"{size} bytes; a call's arguments hold at most {MAX_ARGUMENTS_BYTES}",
            )
        if json_depth(value) > MAX_DEPTH:
            raise BadArgument(str(name), f"nests deeper than {MAX_DEPTH} levels")
    size = len(json.dumps(arguments, ensure_ascii=False).encode())
    if size > MAX_ARGUMENTS_BYTES:
        raise BadArgument(
            "arguments", f"{size} bytes in all; at most {MAX_ARGUMENTS_BYTES}"
        )


def _argument_of(error: jsonschema.ValidationError) -> str:
    path = [str(part) for part in error.absolute_path]
    if error.validator == "required":
        missing = re.match(r"'([^']*)' is a required property", error.message)
        if missing:
            path.append(missing[1])
    elif error.validator == "additionalProperties":
        extra = re.search(r"\('([^']*)'", error.message)
        if extra:
            path.append(extra[1])
    return ".".join(path) or "arguments"


def _read_at(text: str, argument: str) -> dt.datetime:
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadArgument(argument, "not an RFC 3339 date-time") from None
    if moment.tzinfo is None:
        raise BadArgument(argument, "a date-time needs its time zone")
    return moment


def request_of(
    tool: GovernedTool, arguments: Mapping[str, Any] | None
) -> ActionRequest:
    """The governed action a call asks for.

    Raises:
        BadArgument: too large or too deep, missing, mistyped or unknown, naming the
            argument (``fields.email.source``).
    """
    arguments = dict(arguments or {})
    _check_limits(arguments)
    validator = jsonschema.Draft202012Validator(input_schema(tool))
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        raise BadArgument(_argument_of(error), error.message[:300])
    try:
        CanonicalJsonValueField().to_internal_value(arguments["arguments"])
    except serializers.ValidationError as invalid:
        raise BadArgument("arguments", " ".join(map(str, invalid.detail))) from None
    fields = {
        name: FieldRead(
            value=read["value"],
            source=read["source"],
            read_at=_read_at(read["read_at"], f"fields.{name}.read_at"),
        )
        for name, read in arguments["fields"].items()
    }
    return ActionRequest(
        action=tool.action,
        target=tool.target,
        object_type=tool.object_type,
        object_id=arguments["object"]["id"],
        object_version=arguments["object"]["version"],
        fields=fields,
        arguments=arguments["arguments"],
        idempotency_key=arguments["idempotency_key"],
        contract_key=tool.contract.key,
        contract_version=tool.contract.version,
    )


# --- Answers --------------------------------------------------------------------------


def story_uri(task_id: object) -> str:
    return f"portal://tasks/{task_id}/story"


def desk_item_uri(item_id: object) -> str:
    return f"portal://desk-items/{item_id}"


def _text(answer: Mapping[str, Any]) -> str:
    parts = [f"{answer['status']}."]
    if answer.get("reason_code"):
        parts.append(f"Reason: {answer['reason_code']}.")
    if answer.get("failed_fields"):
        parts.append(f"Fields: {', '.join(answer['failed_fields'])}.")
    if answer.get("receipt"):
        parts.append(f"Receipt: {answer['receipt']}.")
    if answer.get("desk_item_id"):
        parts.append(f"Desk item: {answer['desk_item_id']}.")
    approval = answer.get("details", {}).get("approval")
    if approval:
        groups = ", ".join(approval.get("groups") or []) or "the desk"
        parts.append(
            f"Approval: {approval['approval_id']} ({approval.get('approvals', 0)} of "
            f"{approval.get('quorum')} from {groups}; the same call runs once it is "
            "approved)."
        )
    parts.append(answer["next_step"])
    return " ".join(parts)


def outcome_result(outcome: ActionOutcome) -> types.CallToolResult:
    """A governed action's answer: structured, and a short text a model can follow.

    A refusal or a failure is the action's answer, not the tool's error: the call
    worked, and the agent must act on what it says.
    """
    answer: dict[str, Any] = {
        "status": outcome.status,
        "next_step": outcome.next_step,
        "operation_id": str(outcome.operation_id),
        "task_id": str(outcome.task_id),
        "operation_state": outcome.operation_state,
        "task_state": outcome.task_state,
        "reason_code": outcome.reason_code,
        "failed_check": outcome.failed_check,
        "failed_fields": list(outcome.failed_fields),
        "receipt": outcome.provider_reference,
        "desk_item_id": str(outcome.desk_item_id) if outcome.desk_item_id else None,
        "status_url": outcome.status_url,
        "resources": {"story": story_uri(outcome.task_id)},
    }
    if outcome.desk_item_id:
        answer["resources"]["desk_item"] = desk_item_uri(outcome.desk_item_id)
    if outcome.details:  # the desk item's facts: failed fields, the approval
        answer["details"] = json.loads(json.dumps(outcome.details, default=str))
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_text(answer))],
        structured_content=answer,
    )


def error_result(
    *, code: str, detail: str, argument: str | None = None, **members: Any
) -> types.CallToolResult:
    """A tool error (``isError``) the model can read and correct; never a protocol
    error, so the session goes on."""
    answer: dict[str, Any] = {"status": "error", "code": code, "next_step": detail}
    if argument is not None:
        answer["argument"] = argument
    answer.update(members)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{code}: {detail}")],
        structured_content=answer,
        is_error=True,
    )


def portal_error_result(error: PortalError) -> types.CallToolResult:
    """A refusal of the action service (key reused, in flight, not granted…)."""
    detail = str(error)
    if getattr(error, "retryable", False):
        detail += " Repeat this same call (same key) shortly; do not use a new key."
    context = json.loads(json.dumps(error.context, default=str))
    return error_result(code=str(error.code), detail=detail, details=context)
