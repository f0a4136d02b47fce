"""Transaction guards and the one place database errors become domain errors.

``require_transaction`` and ``forbid_transaction`` are the only transaction helpers
(docs/style.md R5). Both ignore the atomic blocks that Django's test cases wrap
around each test (their private ``_from_testcase`` flag, read nowhere else), so tests
see the same guard behaviour as production.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from django.db import IntegrityError, connection
from django.db.models import Model

from .exceptions import (
    IntegrityViolation,
    PortalError,
    TransactionForbidden,
    TransactionRequired,
)

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=Model)

# Constraint or trigger name -> the domain error it means. Apps register theirs once,
# from their ``exceptions`` module, so translation stays in this one function.
_CONSTRAINT_ERRORS: dict[str, type[PortalError]] = {}


def register_constraint_errors(errors: Mapping[str, type[PortalError]]) -> None:
    """Declare which domain error a named constraint or trigger raises."""
    _CONSTRAINT_ERRORS.update(errors)


def _in_real_transaction() -> bool:
    if not connection.in_atomic_block:
        return False
    # Test-case wrappers are not transactions the code under test opened.
    return any(
        not getattr(block, "_from_testcase", False)
        for block in connection.atomic_blocks
    )


def require_transaction() -> None:
    """Raise unless the caller holds a transaction of its own.

    Raises:
        TransactionRequired: no atomic block is open (test-case wrappers excluded).
    """
    if not _in_real_transaction():
        raise TransactionRequired()


def forbid_transaction(reason: str) -> None:
    """Raise if a transaction is open: code that calls the network starts with this.

    Raises:
        TransactionForbidden: an atomic block is open (test-case wrappers excluded).
    """
    if _in_real_transaction():
        raise TransactionForbidden(reason=reason)


def constraint_name(error: IntegrityError) -> str | None:
    """The name of the constraint or trigger PostgreSQL reported, if any."""
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def translate_integrity_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn an ``IntegrityError`` into the domain error its constraint declares.

    Goes *above* ``@transaction.atomic`` so the translation happens after rollback.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except IntegrityError as error:
            name = constraint_name(error)
            error_class = _CONSTRAINT_ERRORS.get(name or "", IntegrityViolation)
            raise error_class(constraint=name) from error

    return wrapper


def db_now() -> dt.datetime:
    """The database clock (``app_now()``): every expiry and age is measured on it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT app_now()")
        (now,) = cursor.fetchone()
    return now


def model_from_row(model: type[M], attnames: Sequence[str], row: Sequence[Any]) -> M:
    """Build a model instance from a raw row, applying the fields' DB converters.

    For hand-written hot-path statements that ``RETURNING`` the concrete columns in
    ``attnames`` order; the result is what the ORM would have loaded.
    """
    fields = _fields_by_attname(model)
    values = []
    for attname, value in zip(attnames, row, strict=True):
        converter = getattr(fields[attname], "from_db_value", None)
        if converter is not None and value is not None:
            value = converter(value, None, connection)
        values.append(value)
    return model.from_db(connection.alias, list(attnames), values)


def joined_model_from_row(
    model: type[M], attnames: Sequence[str], row: Sequence[Any]
) -> M | None:
    """``model_from_row``, or None where a ``LEFT JOIN`` found no row (every column
    NULL, the primary key too)."""
    if row[list(attnames).index(model._meta.pk.attname)] is None:
        return None
    return model_from_row(model, attnames, row)


@functools.cache
def _fields_by_attname(model: type[Model]) -> dict[str, Any]:
    return {field.attname: field for field in model._meta.concrete_fields}


def returning_columns(model: type[Model], alias: str) -> tuple[tuple[str, ...], str]:
    """(attnames, SQL column list) for ``RETURNING`` every concrete column of model."""
    fields = model._meta.concrete_fields
    attnames = tuple(field.attname for field in fields)
    sql = ", ".join(f"{alias}.{field.column}" for field in fields)
    return attnames, sql
