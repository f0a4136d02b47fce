"""Task-state writes have one home (tasks/task_state.py), guarded from the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import connection

from portal.exceptions import IllegalTransition
from tasks import task_state
from tasks.models import TASK_TRANSITIONS, Task, TaskState

ROOT = Path(__file__).resolve().parents[3]

_ANY_TASK = task_state.TaskStateWrite(
    where="t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s",
    stay=frozenset({TaskState.WAITING}),
)


def _write(task: Task, moves: dict[str, str]) -> list[Task]:
    rows = task_state.task_state_write(
        statement=_ANY_TASK,
        moves=moves,
        params={"tenant_id": task.tenant_id, "task_id": task.pk},
    )
    return [task_state.task_from_row(row) for row in rows]


@pytest.mark.django_db
def test_an_undeclared_move_is_refused_before_any_statement(
    make_task, django_assert_num_queries
):
    """A move missing from TASK_TRANSITIONS never reaches the database."""
    # Given a pending task
    task = make_task(state=TaskState.PENDING)
    assert (TaskState.PENDING, TaskState.SUCCEEDED) not in TASK_TRANSITIONS
    # When a write asks for pending -> succeeded
    with django_assert_num_queries(0), pytest.raises(IllegalTransition):
        _write(task, {TaskState.PENDING: TaskState.SUCCEEDED})
    # Then the task is as it was
    task.refresh_from_db()
    assert (task.state, task.state_version) == (TaskState.PENDING, 1)


@pytest.mark.django_db
def test_a_declared_move_writes_state_and_one_version(make_task):
    """The state changes and state_version rises by exactly one."""
    task = make_task(state=TaskState.PENDING)
    (moved,) = _write(task, {TaskState.PENDING: TaskState.RUNNING})
    assert (moved.state, moved.state_version) == (TaskState.RUNNING, 2)
    task.refresh_from_db()
    assert (task.state, task.state_version) == (TaskState.RUNNING, 2)


@pytest.mark.django_db
def test_a_row_outside_the_moves_is_not_written(make_task):
    """Only rows in a move's source state (or a stay state) are touched."""
    # Given a running task, and moves that only start from pending
    task = make_task(state=TaskState.RUNNING)
    # When the write runs, then no row comes back and nothing changed
    assert _write(task, {TaskState.PENDING: TaskState.CANCELLED}) == []
    task.refresh_from_db()
    assert (task.state, task.state_version) == (TaskState.RUNNING, 1)


@pytest.mark.django_db
def test_a_stay_state_keeps_its_state_and_version(make_task):
    """A lease-only write of a stay state moves neither state nor version."""
    task = make_task(state=TaskState.WAITING)
    (kept,) = _write(task, {TaskState.PENDING: TaskState.RUNNING})
    assert (kept.state, kept.state_version) == (TaskState.WAITING, 1)


def test_moves_into_a_state_are_exactly_the_table():
    """task_moves_to lists every declared source of a target, and nothing else."""
    for target in TaskState.values:
        expected = {source for source, to in TASK_TRANSITIONS if to == target}
        assert set(task_state.task_moves_to(target)) == expected


def test_a_state_that_both_moves_and_stays_is_a_programming_error():
    with pytest.raises(ValueError, match="bad task-state write"):
        task_state.task_moves_check(
            {TaskState.RUNNING: TaskState.PENDING}, stay={TaskState.RUNNING}
        )


@pytest.mark.django_db
def test_the_statement_is_one_update_with_the_table_guard():
    """The SQL sets state from the moves and guards on their sources."""
    sql = _ANY_TASK.sql
    assert sql.count("UPDATE tasks_task") == 1
    assert "t.state = ANY(%(_states)s)" in sql
    with connection.cursor() as cursor:  # it parses and plans
        cursor.execute(
            "EXPLAIN " + sql,
            _ANY_TASK.params(
                moves={TaskState.PENDING: TaskState.RUNNING},
                params={"tenant_id": None, "task_id": None},
            ),
        )


def _sql_strings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_other_module_writes_a_task_state():
    """Outside task_state.py, no statement SETs tasks_task.state."""
    offenders = []
    for path in sorted((ROOT / "tasks").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if "/migrations/" in relative or relative == "tasks/task_state.py":
            continue
        for text in _sql_strings(path):
            if "UPDATE tasks_task" not in text:
                continue
            set_clause = re.split(r"\bSET\b", text, maxsplit=1)[-1]
            set_clause = re.split(r"\b(WHERE|FROM|RETURNING)\b", set_clause)[0]
            if re.search(r"(^|[\s,.])state\s*=", set_clause):
                offenders.append(relative)
    assert offenders == []
