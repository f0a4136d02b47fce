"""Reviewers' reads on a hot standby (docs/scale-out.md, "Reviewers on a replica").

With ``PORTAL_REPLICA_DATABASE_URL`` set, ``DATABASES["replica"]`` is a standby with
the same role as the primary, and ``ReplicaRouter`` sends reads there while a view
marked ``reviewer_reads`` runs (the event history, the task's story and the event
export), for the record's tables only (``RECORD_APPS``). Everything else reads and
writes on the primary: writes always, every read inside a transaction on the primary
(read-your-writes: the evidence bundle's reads, which follow a checkpoint signed on
the primary, are such), the takeover desk and the agents' API.

Row-level security holds on the standby as on the primary: the scope is the
transaction-local ``portal.tenant_ids`` setting (portal/scope.py), and
``set_config`` writes nothing, so a read-only standby runs it; each read there runs
in a transaction that begins with it (portal/dbbackend).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, ParamSpec, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

ALIAS: Final = "replica"

# Only the record is read there. Who may see what (people, memberships, grants,
# sessions) is always read on the primary: a revoked grant must not live on in a
# lagging standby.
RECORD_APPS: Final = frozenset({"audit", "tasks"})

_reviewer_reads: ContextVar[bool] = ContextVar("reviewer_reads", default=False)


def configured() -> bool:
    return ALIAS in settings.DATABASES


def read_alias() -> str:
    """Where a reviewer's read goes now: the replica when configured and no
    transaction is open on the primary, else the primary."""
    if configured() and not connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return ALIAS
    return DEFAULT_DB_ALIAS


@contextmanager
def reviewer_reading() -> Iterator[None]:
    token = _reviewer_reads.set(True)
    try:
        yield
    finally:
        _reviewer_reads.reset(token)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def reviewer_reads(view: Callable[_P, _R]) -> Callable[_P, _R]:
    """A read-only page: its reads go to the replica when one is configured. A
    template response is rendered here, so the template's reads go there too."""

    @functools.wraps(view)
    def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with reviewer_reading():
            response = view(*args, **kwargs)
            render = getattr(response, "render", None)
            if render is not None and not getattr(response, "is_rendered", True):
                render()
            return response

    return wrapped


class ReplicaRouter:
    """Reads of a ``reviewer_reads`` page to the replica; all else to the primary."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        if _reviewer_reads.get() and model._meta.app_label in RECORD_APPS:  # type: ignore[attr-defined]
            return read_alias()
        return None

    def db_for_write(self, model: type, **hints: Any) -> str | None:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        # One database, two doors: a row read on the standby is the primary's row.
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db == ALIAS else None


@dataclass(frozen=True)
class Lag:
    """How far the replica is behind, as the standby itself reports it."""

    in_recovery: bool  # False: the URL found no standby and reads hit a primary
    caught_up: bool  # everything received has been replayed, replay not paused
    seconds: float | None  # now - the last replayed commit's time, if any
    last_replay: datetime | None


def replica_lag() -> Lag | None:
    """The replica's lag, or None when no replica is configured."""
    if not configured():
        return None
    with transaction.atomic(using=ALIAS), connections[ALIAS].cursor() as cursor:
        cursor.execute(
            "SELECT pg_is_in_recovery(),"
            " pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn()"
            " AND NOT pg_is_wal_replay_paused(),"
            " extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()),"
            " pg_last_xact_replay_timestamp()"
        )
        in_recovery, caught_up, seconds, last = cursor.fetchone()
    return Lag(
        in_recovery=bool(in_recovery),
        caught_up=bool(in_recovery and caught_up),
        seconds=float(seconds) if seconds is not None else None,
        last_replay=last,
    )
