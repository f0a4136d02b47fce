"""The one helper for running code in parallel threads, each on its own connection."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def run_in_threads(*functions: Callable[[], Any], timeout: float = 60) -> list[Any]:
    """Run each function in its own thread; return each result or raised exception.

    Every thread uses its own database connection (Django's are per thread), and closes
    it in ``finally`` so no connection outlives the test. Each runs in a copy of the
    caller's context, so it works in the test's tenant scope (portal/scope.py). Callers line the threads up
    with a ``threading.Barrier`` inside the functions.
    """
    outcomes: list[Any] = [None] * len(functions)

    def run(index: int, function: Callable[[], Any]) -> None:
        try:
            with connection.cursor() as cursor:
                # A stuck lock fails the test instead of hanging it.
                cursor.execute("SET lock_timeout = '10s'")
            outcomes[index] = function()
        except BaseException as error:  # noqa: BLE001
            outcomes[index] = error
        finally:
            connection.close()

    threads = [
        threading.Thread(
            target=contextvars.copy_context().run,
            args=(run, index, function),
            daemon=True,
        )
        for index, function in enumerate(functions)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"a thread ran longer than {timeout} s")
    return outcomes
