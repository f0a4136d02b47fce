"""Django from the SDK's async handlers: every database call runs in a worker thread.

``sync_to_async(thread_sensitive=False)``: a slow remote call of one tool call must
not hold up the others (a thread-sensitive call would queue them all on one
thread). Each worker thread keeps its own database connection, so the work is
bracketed as Django brackets a request: connections past their age, or broken, are
closed before and after (``close_old_connections``).

The tenant scope (``portal.scope``) is a context variable, and ``sync_to_async``
copies the thread's context changes back to the caller: the work must set its
scope inside ``scope.unit_of_work()``, which resets it before the thread returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _bracketed(work: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    close_old_connections()
    try:
        return work(*args, **kwargs)
    finally:
        close_old_connections()


async def in_worker_thread(
    work: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs
) -> _R:
    """Run ``work`` in a worker thread, its database connections bracketed."""
    return await sync_to_async(_bracketed, thread_sensitive=False)(
        work, *args, **kwargs
    )
