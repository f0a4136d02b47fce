"""The tenant scope of row-level security (docs/database-roles.md).

Which tenants' rows the current unit of work may see: the authenticated agent's
tenant for an API request, a person's tenants for the admin, a job's or a command's
tenant. It lives in a context variable and reaches PostgreSQL as the
``portal.tenant_ids`` setting, set with ``set_config(…, true)``: transaction-local,
at the start of each transaction (``portal/dbbackend``) and again when the scope
changes inside one, never session-wide, so a pooled connection carries nothing into
the next request, job or error path. No scope, no rows: the policies compare
``tenant_id`` with the setting, and an unset setting matches nothing.

A statement outside any transaction runs in a short one of its own while a scope is
set (``scoped_statement``), so autocommit reads are scoped too.

Work across tenants (the relay, the reaper, log-in…) learns which tenants have work
from a discovery function (``discover``, ``in_tenants_with``), which returns tenant
ids and nothing else, then works under exactly that scope with the same policies.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, Final, ParamSpec, TypeVar

import psycopg
import psycopg.sql
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.pq import ExecStatus

from .db_roles import DISCOVERY_FUNCTIONS

SETTING: Final = "portal.tenant_ids"

_scope: ContextVar[frozenset[str] | None] = ContextVar("tenant_scope", default=None)


def current() -> frozenset[str] | None:
    """The tenant ids of the current scope; None when no scope is set."""
    return _scope.get()


def _value(ids: frozenset[str] | None) -> str:
    return ",".join(sorted(ids)) if ids else ""


def apply(connection: BaseDatabaseWrapper) -> None:
    """Set the scope for the transaction ``connection`` is in (or is starting)."""
    ids = _scope.get()
    raw = connection.connection
    if raw is None:
        return
    raw.execute("SELECT set_config(%s, %s, true)", [SETTING, _value(ids)])


def begin_statement(raw: psycopg.Connection[Any]) -> bytes:
    """``BEGIN`` as psycopg would send it, and the current scope's ``set_config``:
    two statements for one simple query, so a scoped transaction starts in one round
    trip (``portal/dbbackend``)."""
    parts = ["BEGIN"]
    if raw.isolation_level is not None:
        level = psycopg.IsolationLevel(raw.isolation_level).name.replace("_", " ")
        parts.append(f"ISOLATION LEVEL {level}")
    if raw.read_only is not None:
        parts.append("READ ONLY" if raw.read_only else "READ WRITE")
    if raw.deferrable is not None:
        parts.append("DEFERRABLE" if raw.deferrable else "NOT DEFERRABLE")
    return _begin_with_scope(" ".join(parts), _value(_scope.get()))


@functools.lru_cache(maxsize=256)
def _begin_with_scope(begin: str, value: str) -> bytes:
    # The value is tenant UUIDs joined by commas (``_ids``), quoted all the same.
    literal = psycopg.sql.Literal(value).as_bytes(None)
    setting = psycopg.sql.Literal(SETTING).as_bytes(None)
    return b"%s; SELECT set_config(%s, %s, true)" % (begin.encode(), setting, literal)


def _apply_to_open_transactions() -> None:
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and not connection.autocommit:
            apply(connection)


def _set(ids: frozenset[str] | None) -> Token[frozenset[str] | None]:
    token = _scope.set(ids)
    _apply_to_open_transactions()
    return token


def _reset(token: Token[frozenset[str] | None]) -> None:
    _scope.reset(token)
    _apply_to_open_transactions()


def _ids(tenant_ids: Iterable[uuid.UUID | str]) -> frozenset[str]:
    return frozenset(str(uuid.UUID(str(t))) for t in tenant_ids)


@contextmanager
def tenant_scope(tenant_ids: Iterable[uuid.UUID | str]) -> Iterator[None]:
    """Run the block with exactly these tenants in scope, then the scope before."""
    token = _set(_ids(tenant_ids))
    try:
        yield
    finally:
        _reset(token)


def enter(tenant_ids: Iterable[uuid.UUID | str]) -> None:
    """Set the scope until the surrounding request, job or command ends (they reset
    it): for authentication, which learns the tenant halfway through a request."""
    _set(_ids(tenant_ids))


def include(tenant_id: uuid.UUID | str) -> None:
    """Add one tenant to the current scope (the test fixtures that make tenants)."""
    _set((_scope.get() or frozenset()) | _ids([tenant_id]))


@contextmanager
def unit_of_work() -> Iterator[None]:
    """A request, job or command: it starts with no scope and leaves none behind."""
    token = _set(None)
    try:
        yield
    finally:
        _reset(token)


def scoped_statement(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
) -> Any:
    """Database execute wrapper: an autocommit statement under a scope gets its own
    transaction, so the transaction-local setting reaches it."""
    connection = context["connection"]
    if _scope.get() is None or not connection.get_autocommit():
        return execute(sql, params, many, context)
    with transaction.atomic(using=connection.alias):
        return execute(sql, params, many, context)


_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextmanager
def every_tenant() -> Iterator[None]:
    """The scope of every tenant, for the few readers that are global by nature:
    retention's horizon (``audit_retention_global_horizon`` refuses a scope that
    leaves one out) and the operator's ``/metrics`` gauges. ``portal_tenant`` has no
    tenant scope of its own, so the list is read first."""
    from .models import Tenant

    with tenant_scope(Tenant.objects.values_list("pk", flat=True)):
        yield


def discover(function: str, *args: Any) -> list[str]:
    """The tenant ids one discovery function returns (``db_roles.DISCOVERY_FUNCTIONS``,
    named without its argument types), e.g. which tenants have lapsed leases.

    The functions bypass row-level security to say *which* tenants, never anything
    else; the caller then works under that scope (``tenant_scope``).
    """
    if not any(f.startswith(function + "(") for f in DISCOVERY_FUNCTIONS):
        raise ValueError(f"{function} is not a discovery function")
    placeholders = ", ".join(["%s"] * len(args))
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT * FROM {function}({placeholders})", list(args))
        return sorted({str(row[0]) for row in cursor.fetchall() if row[0]})


def in_tenants_with(function: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Run the decorated work under the scope of the tenants ``function`` discovers
    (and only them), then the scope before. Outermost decorator: the scope must be
    set before the work's transaction begins."""

    def decorate(work: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(work)
        def scoped(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with tenant_scope(discover(function)):
                return work(*args, **kwargs)

        return scoped

    return decorate


def one_round_trip(sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Run one statement as a transaction of its own under the current scope, in one
    round trip, and return its rows (none for a statement that returns none).

    The scope's ``set_config(…, true)`` and the statement go to the server as one
    psycopg pipeline closed by one Sync: PostgreSQL runs the messages before a Sync
    in one implicit transaction and commits at the Sync, so the setting reaches the
    statement and ends with it, and the statement commits, or fails and rolls back,
    alone (no ``BEGIN`` and ``COMMIT`` of their own). Django's execute wrappers see
    the statement as they see any other, except ``scoped_statement``, whose work this
    is. Errors come as Django's database errors.

    Raises:
        RuntimeError: called inside an atomic block (use a cursor there).
    """
    connection = connections["default"]
    if connection.in_atomic_block:
        raise RuntimeError("one_round_trip runs its own transaction")
    connection.ensure_connection()
    raw = connection.connection
    setting = ("SELECT set_config(%s, %s, true)", [SETTING, _value(_scope.get())])

    def run(sql: str, params: Any, many: bool, context: Any) -> list[tuple[Any, ...]]:
        with raw.pipeline():
            raw.execute(*setting)
            cursor = raw.cursor()
            cursor.execute(sql, params)
        # The result's status, not ``cursor.description``: that builds a Column
        # object per returned column on every call (26 for a transition's row).
        result = cursor.pgresult
        if result is None or result.status != ExecStatus.TUPLES_OK:
            return []
        return cursor.fetchall()

    call: Callable[..., Any] = run
    for wrapper in reversed(connection.execute_wrappers):
        if wrapper is not scoped_statement:
            call = functools.partial(wrapper, call)
    with connection.wrap_database_errors:
        rows: list[tuple[Any, ...]] = call(
            sql, params, False, {"connection": connection, "cursor": None}
        )
    return rows
