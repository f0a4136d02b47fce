"""Arguments nested too deep for the SDK's parser become a tool error, not a crash.

The SDK parses each message with pydantic-core, which stops at 200 levels of
nesting and answers a JSON-RPC parse error: a model that sent a deep argument
would learn nothing about which one. Before the SDK sees such a message, it is
parsed here with the standard library, and each ``tools/call`` argument nested
deeper than the portal's limit (``portal.parsers.MAX_DEPTH``) is replaced by a
marker, ``{"$too_deep": <depth>}``, which the tool call reports as a bad argument
(``tools.request_of``). Messages the SDK can parse pass untouched.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Final

import pydantic_core
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from portal.parsers import MAX_DEPTH, json_depth

TOO_DEEP: Final = "$too_deep"
# Bodies past this are the SDK's to refuse (its own request body limit).
_BUFFER_MAX: Final = 4 * 1024 * 1024


def marked(raw: str) -> str | None:
    """The message with too-deep arguments marked; None when it needs no change."""
    try:
        pydantic_core.from_json(raw)
        return None
    except ValueError as error:
        if "recursion limit" not in str(error):
            return None  # not JSON at all: the SDK says so
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    params = message.get("params") if isinstance(message, dict) else None
    arguments = params.get("arguments") if isinstance(params, dict) else None
    if message.get("method") != "tools/call" or not isinstance(arguments, dict):
        return None
    for name, value in arguments.items():
        depth = json_depth(value)
        if depth > MAX_DEPTH:
            arguments[name] = {TOO_DEEP: depth}
    return json.dumps(message)


def too_deep(value: Any) -> int | None:
    """The depth a marker reports; None when ``value`` is no marker."""
    if isinstance(value, dict) and set(value) == {TOO_DEEP}:
        depth = value[TOO_DEEP]
        return depth if isinstance(depth, int) else None
    return None


class MarkTooDeep:
    """ASGI middleware: a POSTed message's too-deep arguments marked (``marked``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more and size <= _BUFFER_MAX:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([], message, receive), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        if more:  # too large to look at: the SDK refuses it
            await self.app(scope, _replay(chunks, None, receive, more=True), send)
            return
        body = b"".join(chunks)
        try:
            changed = marked(body.decode())
        except UnicodeDecodeError:
            changed = None  # not JSON: the SDK says so
        if changed is not None:
            body = changed.encode()
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            scope = {**scope, "headers": headers}
        await self.app(scope, _replay([body], None, receive), send)


def _replay(
    chunks: list[bytes], last: Message | None, receive: Receive, *, more: bool = False
) -> Receive:
    pending: AsyncIterator[Message] = _messages(chunks, last, more)

    async def replayed() -> Message:
        async for message in pending:
            return message
        return await receive()

    return replayed


async def _messages(
    chunks: list[bytes], last: Message | None, more: bool
) -> AsyncIterator[Message]:
    for index, chunk in enumerate(chunks):
        tail = index == len(chunks) - 1
        yield {"type": "http.request", "body": chunk, "more_body": more or not tail}
    if last is not None:
        yield last


class MarkedLines:
    """stdin's lines for the SDK's stdio server, too-deep arguments marked."""

    def __init__(self, lines: Any) -> None:
        self.lines = lines

    async def __aiter__(self) -> AsyncIterator[str]:
        async for line in self.lines:
            changed = marked(line)
            yield line if changed is None else f"{changed}\n"
