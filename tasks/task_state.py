"""The one home of task-state writes, and the task row mapper.

Every statement that may change ``tasks_task.state`` is built and run by
``task_state_write``: services (transition, lease release, claim, reaper, wake-up),
the takeover (claim, release, resolve) and the gateway's escalation all come here.
The caller names its moves (``{source: target}``); each move must be a pair of
``TASK_TRANSITIONS``, or the write is refused before it reaches the database. The
statement then only touches rows whose current state is one of the move's sources
(or a state the caller lets stay), sets the new state, and raises ``state_version``
by one exactly when the state changes. The ``tasks_task_guard_trg`` trigger
(migration ``tasks/0002``) is the second wall.

Hot paths stay one data-modifying statement per call (docs/style.md R4): each caller
declares its statement once, as a ``TaskStateWrite`` (its own guard, extra
assignments for lease, reason or step, and an optional ``WITH`` that picks rows
``FOR UPDATE SKIP LOCKED``); the state guard and the state change themselves are
always this module's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from django.db import connection

from portal import db as portal_db
from portal.exceptions import IllegalTransition

from .models import TASK_TRANSITIONS, Task, TaskState

TASK_STATES: Final = frozenset(TaskState.values)
"""Every task state's value (``TaskState.values`` builds a new list on each read)."""

TASK_ATTNAMES, TASK_COLUMNS = portal_db.returning_columns(Task, "t")
"""Every concrete column of ``tasks_task`` (alias ``t``), in ``task_from_row`` order.

Put ``RETURNING {TASK_COLUMNS}`` last in a hand-written statement and hand the row
(or its tail) to ``task_from_row``.
"""

_TEMPLATE: Final = """
{with_}UPDATE tasks_task AS t SET
    state = COALESCE(%(_moves)s::jsonb ->> t.state, t.state),
    state_version = t.state_version
        + ((%(_moves)s::jsonb ->> t.state) IS NOT NULL)::int,{assignments}
    updated_at = statement_timestamp()
{from_}WHERE t.state = ANY(%(_states)s) AND {where}
RETURNING {returning}
"""


def task_from_row(row: Sequence[Any]) -> Task:
    """A ``Task`` from a raw row that returns ``TASK_COLUMNS`` (no query is made).

    The values go through the fields' database converters, so the instance is what
    the ORM would have loaded.
    """
    return portal_db.model_from_row(Task, TASK_ATTNAMES, row)


@functools.cache
def task_moves_to(to: str) -> Mapping[str, str]:
    """Every legal move into ``to``: ``{source: to}`` for each source in the table."""
    return {source: to for source, target in sorted(TASK_TRANSITIONS) if target == to}


def task_moves_check(moves: Mapping[str, str], stay: Collection[str] = ()) -> None:
    """Refuse moves that ``TASK_TRANSITIONS`` does not declare.

    Raises:
        IllegalTransition: a move is not a declared transition.
        ValueError: a state both moves and stays, or is not a task state (a bug in
            the caller: fix the call, not the table).
    """
    for source, target in sorted(moves.items()):
        if (source, target) not in TASK_TRANSITIONS:
            raise IllegalTransition(current=source, requested=target)
    unknown = (set(moves) | set(stay)) - TASK_STATES
    if unknown or set(moves) & set(stay):
        raise ValueError(f"bad task-state write: moves={moves!r}, stay={stay!r}")


@dataclass(frozen=True, kw_only=True)
class TaskStateWrite:
    """The shape of one statement that writes task states (its moves come per call).

    Attributes:
        where: the caller's own guard, with named parameters (the task, its
            version, its lease); the table is ``t``.
        assignments: further ``SET`` items (lease columns, reason, step), each
            ``column = expression`` reading the row before the write as ``t``.
        stay: states a row may be in and keep (a lease-only change, such as the
            release of a waiting task); their ``state_version`` does not move.
        with_: a ``WITH`` clause that picks rows (``FOR UPDATE SKIP LOCKED``).
        from_: the relation the ``WITH`` defines, joined in ``where``.
        returning_old: columns whose values *before* the write come first in each
            returned row, named ``old_<column>``, then ``TASK_COLUMNS``. The state
            alone comes from the list of states the row may be written from (the
            one equal to the row's), other columns from a self-join (``old``): the
            task is read once where only its state before the write is asked for.
    """

    where: str
    assignments: tuple[str, ...] = ()
    stay: frozenset[str] = frozenset()
    with_: str = ""
    from_: str = ""
    returning_old: tuple[str, ...] = ()

    @functools.cached_property
    def sql(self) -> str:
        """The statement text: the same for every call, so it is prepared once."""
        relations = [self.from_] if self.from_ else []
        old = ""
        if self.returning_old == ("state",):
            # The state before the write without reading the task again: the row
            # matches exactly one of the states it may be written from.
            relations.append("unnest(%(_states)s::text[]) AS old(state)")
            old = "old.state = t.state AND "
        elif self.returning_old:
            relations.append("tasks_task AS old")
            old = "old.id = t.id AND "
        return _TEMPLATE.format(
            with_=f"{self.with_}\n" if self.with_ else "",
            assignments="".join(f"\n    {item}," for item in self.assignments),
            from_=f"FROM {', '.join(relations)}\n" if relations else "",
            where=f"{old}({self.where})",
            returning=", ".join(
                [
                    *(f"old.{column} AS old_{column}" for column in self.returning_old),
                    TASK_COLUMNS,
                ]
            ),
        )

    def params(
        self, *, moves: Mapping[str, str], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``params`` plus the state guard for ``moves``, once they are checked.

        Raises:
            IllegalTransition: a move is not declared in ``TASK_TRANSITIONS``.
        """
        task_moves_check(moves, self.stay)
        return {
            **params,
            # Sorted, so one set of moves is always the same parameter value.
            "_moves": json.dumps(dict(sorted(moves.items()))),
            "_states": sorted({*moves, *self.stay}),
        }


def task_state_write(
    *,
    statement: TaskStateWrite,
    moves: Mapping[str, str],
    params: Mapping[str, Any],
) -> list[tuple[Any, ...]]:
    """Write task states: the only way ``tasks_task.state`` changes.

    ``moves`` maps a current state to its new state; each pair must be in
    ``TASK_TRANSITIONS``. Only rows in one of the moves' sources (or the statement's
    ``stay`` states) and passing the statement's ``where`` are written; a moved row's
    ``state_version`` rises by one. The caller's transaction holds the write.

    Returns:
        One row per task written: ``statement.returning_old`` values, then
        ``TASK_COLUMNS`` (hand ``row[len(returning_old):]`` to ``task_from_row``).
        No row means a guard held: the caller reloads and says why.

    Raises:
        IllegalTransition: a move is not declared in ``TASK_TRANSITIONS``; nothing
            was written.
    """
    bound = statement.params(moves=moves, params=params)
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, bound)
        return cursor.fetchall()
