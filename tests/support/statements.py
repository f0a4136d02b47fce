"""The statements a block of code runs on the test's connection, counted by label."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import connection

_SAVEPOINT = re.compile(r"^\s*(SAVEPOINT|RELEASE SAVEPOINT|ROLLBACK TO SAVEPOINT)\b")


@contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL of every statement run inside the block on this thread's connection,
    savepoints left out (a test's transaction adds them; production has none)."""
    seen: list[str] = []

    def capture(
        execute: Callable[..., Any],
        sql: str,
        params: Any,
        many: bool,
        context: Mapping[str, Any],
    ) -> Any:
        if not _SAVEPOINT.match(sql):
            seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield seen


def label(sql: str) -> str:
    """A statement's verb and first table (``SELECT tasks_task``), for messages."""
    verb = sql.split(None, 1)[0].upper()
    tables = re.findall(r'(?:FROM|INTO|UPDATE|JOIN)\s+"?(\w+)"?', sql, re.IGNORECASE)
    return f"{verb} {tables[0]}" if tables else sql[:60]
