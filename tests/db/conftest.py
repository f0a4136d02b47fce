from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction


@contextmanager
def refused_by(name: str) -> Iterator[None]:
    """Expect PostgreSQL to refuse the statement, naming constraint or trigger ``name``."""
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        yield
    diag = caught.value.__cause__.diag  # type: ignore[union-attr]
    assert diag.constraint_name == name, diag.message_primary


@contextmanager
def refused_for_privilege() -> Iterator[None]:
    """Expect PostgreSQL to refuse the statement for want of a privilege (42501)."""
    with pytest.raises(ProgrammingError) as caught, transaction.atomic():
        yield
    assert caught.value.__cause__.sqlstate == "42501", caught.value  # type: ignore[union-attr]


def execute(sql: str, params: list | tuple | None = None) -> int:
    """Run raw SQL on the test connection; the number of rows it touched."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
