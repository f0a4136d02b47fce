"""Django from the SDK's async handlers: every database call runs in a worker thread.

The threads are this module's own pool (``PORTAL_MCP_THREADS`` per process, default
8), not the event loop's default executor: that one has ``cpu_count + 4`` threads
(six on two cores), and a tool call holds its thread for the whole governed action,
remote call included, so eight concurrent calls queued behind six. The pool is not
thread-sensitive either: a slow remote call of one tool call must not hold up the
others. Each worker thread keeps its own database connection, so the work is
bracketed as Django brackets a request: connections past their age, or broken, are
closed before and after (``close_old_connections``).

The tenant scope (``portal.scope``) is a context variable, and ``sync_to_async``
copies the thread's context changes back to the caller: the work must set its
scope inside ``scope.unit_of_work()``, which resets it before the thread returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

_P = ParamSpec("_P")
_R = TypeVar("_R")

DEFAULT_THREADS: Final = 8


def pool_size() -> int:
    """``PORTAL_MCP_THREADS`` or 8: concurrent tool calls per MCP process (each
    holds one database connection while it runs)."""
    return max(1, int(os.environ.get("PORTAL_MCP_THREADS", DEFAULT_THREADS)))


_POOL: Final = ThreadPoolExecutor(max_workers=pool_size(), thread_name_prefix="mcp")


def _bracketed(work: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    close_old_connections()
    try:
        return work(*args, **kwargs)
    finally:
        close_old_connections()


async def in_worker_thread(
    work: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs
) -> _R:
    """Run ``work`` in one of the pool's threads, its database connections
    bracketed."""
    return await sync_to_async(_bracketed, thread_sensitive=False, executor=_POOL)(
        work, *args, **kwargs
    )
