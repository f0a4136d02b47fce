"""The MCP server: the SDK's low-level ``Server``, its handlers, and its two doors.

The low-level server, not ``MCPServer``: the tools are generated per caller from
grants and contracts (exact schemas, no Python signature to derive them from).

Every handler does its Django work in a worker thread (``threads``), under the
calling agent's tenant scope, set and cleared there (``scope.unit_of_work`` around
``auth.caller``). Nothing a caller sends ends the session: a bad call is a tool error
naming the argument, and an unexpected failure is a tool error too (logged here).
"""

from __future__ import annotations

import io
import json
import logging
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Final, cast
from urllib.parse import urlsplit

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette

from portal import scope
from portal.exceptions import PortalError
from portal.models import Agent, AgentKey
from portal.tracing import Trace, tracer
from tasks import actions
from tasks import services as task_services
from tasks.exceptions import TaskNotFound

from . import auth, deep, resources, tools
from .exceptions import BadArgument, UnknownResource
from .threads import in_worker_thread

logger = logging.getLogger(__name__)

SERVER_NAME: Final = "agent-governance-portal"
INSTRUCTIONS: Final = (
    "Each tool is one governed action you are granted. Give every required field "
    "with its value, source and read time, and an idempotency key naming the side "
    "effect. Repeat a call only with the same key; never make up a new key to retry. "
    "Read a task's story and a desk item's status as resources."
)
# JSON-RPC's "invalid request": the key stopped authenticating mid-session (stdio;
# over HTTP the bearer middleware answers 401 first), or the agent or its tenant is
# frozen (either transport; the message names AGENT_FROZEN or TENANT_FROZEN).
_KEY_REFUSED_CODE: Final = -32600
_RESOURCE_NOT_FOUND_CODE: Final = -32002  # the MCP specification's


@dataclass(frozen=True)
class _Caller:
    """Who sends this request: the key's secret, and the key if the bearer check of
    this very request found it live (HTTP); None over stdio."""

    secret: str
    checked: AgentKey | None = None


def _caller_of(
    ctx: ServerRequestContext[Any, Any], stdio_secret: str | None
) -> _Caller:
    user = getattr(ctx.request, "user", None) if ctx.request is not None else None
    if isinstance(user, AuthenticatedUser):
        token = user.access_token
        checked = token.key if isinstance(token, auth.AgentAccessToken) else None
        return _Caller(token.token, checked)
    if stdio_secret is None:  # an HTTP request the bearer middleware let through
        raise MCPError(_KEY_REFUSED_CODE, "Authentication required.")
    return _Caller(stdio_secret)


def _as_agent(secret: _Caller, method: str, work: Any, *args: Any) -> Any:
    """``work(agent, *args)`` as the key's agent, in its tenant scope; the scope is
    cleared before the thread returns. ``method`` (JSON-RPC) names a refusal."""
    with scope.unit_of_work():
        agent = auth.caller(secret=secret.secret, method=method, checked=secret.checked)
        return work(agent, *args)


def _listed(agent: Agent) -> list[types.Tool]:
    governed = [tools.mcp_tool(tool) for tool in tools.tool_list(agent=agent)]
    return [*governed, tools.record_version_tool()]


def _version_recorded(agent: Agent, arguments: Any) -> types.CallToolResult:
    try:
        path = tools.record_version_of(arguments)
    except BadArgument as bad:
        return tools.error_result(
            code="INVALID_ARGUMENT", detail=str(bad), argument=bad.argument
        )
    record = task_services.object_version_record(tenant=agent.tenant, **path)
    answer = {
        "status": "recorded",
        **path,
        "version": record.version,
        "updated_at": record.updated_at.isoformat(),
        "next_step": "Take the governed action with this object version.",
    }
    return types.CallToolResult(
        content=[
            types.TextContent(
                type="text",
                text=f"Recorded {path['object_type']}/{path['object_id']} at "
                f"version {record.version}.",
            )
        ],
        structured_content=answer,
    )


def _called(agent: Agent, name: str, arguments: Any) -> types.CallToolResult:
    if name == tools.RECORD_VERSION_TOOL:
        return _version_recorded(agent, arguments)
    tool = tools.tool_find(agent=agent, name=name)
    if tool is None:
        return tools.error_result(
            code="UNKNOWN_TOOL",
            detail=f"You have no tool named {name!r}; tools/list shows yours.",
            argument="name",
        )
    try:
        request = tools.request_of(tool, arguments)
    except BadArgument as bad:
        return tools.error_result(
            code="INVALID_ARGUMENT", detail=str(bad), argument=bad.argument
        )
    try:
        outcome = actions.action_take(
            agent=agent, request=request, trace=Trace.current()
        )
    except PortalError as error:
        return tools.portal_error_result(error)
    return tools.outcome_result(outcome)


def _call_safely(secret: _Caller, name: str, arguments: Any) -> types.CallToolResult:
    try:
        return _as_agent(secret, "tools/call", _called, name, arguments)
    except auth.KeyRefused as refused:
        return tools.error_result(code=refused.code, detail=str(refused))
    except Exception:
        logger.exception("tool call %r failed", name)
        return tools.error_result(
            code="INTERNAL",
            detail="The portal could not answer this call. Repeat the same call "
            "(same idempotency key) later; never use a new key for it.",
        )


def _read(agent: Agent, uri: str) -> dict[str, Any]:
    return resources.resource_read(agent=agent, uri=uri)


def build_server(*, stdio_secret: str | None = None) -> Server[Any]:
    """The server; ``stdio_secret`` is the key of a stdio session (over HTTP each
    request brings its own)."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        secret = _caller_of(ctx, stdio_secret)
        try:
            listed = await in_worker_thread(_as_agent, secret, "tools/list", _listed)
        except auth.KeyRefused as refused:
            raise MCPError(_KEY_REFUSED_CODE, f"{refused.code}: {refused}") from None
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        secret = _caller_of(ctx, stdio_secret)
        # The GenAI tool-execution span (OpenTelemetry semantic conventions), under
        # the SDK's span of the MCP request; the gateway's spans and its call to the
        # remote (traceparent) follow in the same trace.
        with tracer(__name__).start_as_current_span(
            f"execute_tool {params.name}",
            kind=SpanKind.INTERNAL,
            attributes={
                gen_ai.GEN_AI_OPERATION_NAME: (
                    gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value
                ),
                gen_ai.GEN_AI_TOOL_NAME: params.name,
                gen_ai.GEN_AI_TOOL_CALL_ID: str(ctx.request_id),
                gen_ai.GEN_AI_TOOL_TYPE: "extension",
            },
        ) as span:
            result = await in_worker_thread(
                _call_safely, secret, params.name, params.arguments
            )
            if result.is_error:
                span.set_attribute("error.type", "tool_error")
            return result

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        # Stories and desk items are named by the tool's answers (resources), and
        # read through the templates; there is no list of them to browse.
        return types.ListResourcesResult(resources=[])

    async def list_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=resources.TEMPLATES)

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        secret = _caller_of(ctx, stdio_secret)
        uri = str(params.uri)
        try:
            body = await in_worker_thread(
                _as_agent, secret, "resources/read", _read, uri
            )
        except auth.KeyRefused as refused:
            raise MCPError(_KEY_REFUSED_CODE, f"{refused.code}: {refused}") from None
        except (UnknownResource, TaskNotFound, ValueError):
            raise MCPError(
                _RESOURCE_NOT_FOUND_CODE, "Resource not found", {"uri": uri}
            ) from None
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=uri,
                    mime_type="application/json",
                    text=json.dumps(body, default=str),
                )
            ]
        )

    return Server(
        SERVER_NAME,
        version="1",
        title="Agent governance portal",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


def http_app(*, public_url: str, issuer_url: str) -> Starlette:
    """The streamable-HTTP app: ``public_url``'s path (``/mcp``), Bearer agent keys,
    and the RFC 9728 metadata at ``/.well-known/oauth-protected-resource/mcp``.

    ``issuer_url`` is where keys come from (the portal, whose admin issues them);
    it is published as the authorization server. Requests must be addressed to
    ``public_url``'s host, or to localhost (DNS-rebinding protection).
    """
    parts = urlsplit(public_url)
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    if parts.hostname and f"{parts.hostname}:*" not in hosts:
        hosts += [parts.hostname, f"{parts.hostname}:*"]
        origins += [f"{parts.scheme}://{parts.netloc}"]
    server = build_server()
    app = server.streamable_http_app(
        streamable_http_path=parts.path or "/mcp",
        # Stateless: each request stands alone (its own Bearer key, no session
        # held in one process's memory), so several processes serve one port
        # (``manage.py mcp --http --processes``). Nothing here uses the session
        # (no server-to-client requests, no subscriptions); each answer is one
        # JSON body rather than an event stream.
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=hosts,
            allowed_origins=origins,
        ),
        # From strings: the settings keep a path-less URL as given (no "/" added).
        auth=AuthSettings.model_validate(
            {
                "issuer_url": issuer_url,
                "resource_server_url": public_url,
                # An agent key names no resource: the verifier is the portal's own.
                "validate_token_resource": False,
            }
        ),
        token_verifier=auth.AgentKeyVerifier(),
    )
    app.add_middleware(deep.MarkTooDeep)
    app.add_middleware(auth.FailedAuthThrottle)
    app.add_middleware(auth.RequestFacts)
    return app


async def serve_stdio(*, secret: str) -> None:
    """Serve one session over this process's stdin and stdout, as ``secret``'s agent."""
    server = build_server(stdio_secret=secret)
    stdin = anyio.wrap_file(
        io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    )
    lines = cast(anyio.AsyncFile[str], deep.MarkedLines(stdin))
    async with stdio_server(stdin=lines) as (read_stream, write_stream):
        await server.run(
            read_stream, write_stream, server.create_initialization_options()
        )


def check_key(secret: str) -> uuid.UUID:
    """The agent id of a live key (stdio checks its key before it serves).

    Raises:
        KeyRefused: the key does not authenticate, or its agent or tenant is
            frozen.
    """
    with scope.unit_of_work():
        return auth.caller(secret=secret, method="stdio").pk
