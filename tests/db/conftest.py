from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, connection, transaction


@contextmanager
def refused_by(name: str) -> Iterator[None]:
    """Expect PostgreSQL to refuse the statement, naming constraint or trigger ``name``."""
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        yield
    diag = caught.value.__cause__.diag  # type: ignore[union-attr]
    assert diag.constraint_name == name, diag.message_primary


def execute(sql: str, params: list | tuple | None = None) -> int:
    """Run raw SQL on the test connection; the number of rows it touched."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
