"""Invariant 3: only declared transitions; state_version rises by exactly one.

The whole table is tried against the trigger both ways: every declared pair is
accepted and every other pair is refused, so the SQL copy in migration
tasks/0002 cannot drift from ``TASK_TRANSITIONS`` / ``OPERATION_TRANSITIONS``.
"""

from __future__ import annotations

from itertools import product

import pytest

from tasks.models import (
    OPERATION_TRANSITIONS,
    TASK_TRANSITIONS,
    OperationState,
    TaskState,
)

from .conftest import execute, refused_by

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("old", "new"), list(product(TaskState.values, repeat=2)))
def test_task_trigger_accepts_exactly_the_declared_transitions(make_task, old, new):
    task = make_task(state=old)
    sql = "UPDATE tasks_task SET state = %s, state_version = state_version + 1 WHERE id = %s"
    if old == new or (old, new) in TASK_TRANSITIONS:
        assert execute(sql, [new, task.pk]) == 1
        task.refresh_from_db()
        assert (task.state, task.state_version) == (new, 2)
    else:
        with refused_by("tasks_task_transition_trg"):
            execute(sql, [new, task.pk])


@pytest.mark.parametrize(("old", "new"), list(product(OperationState.values, repeat=2)))
def test_operation_trigger_accepts_exactly_the_declared_transitions(
    make_operation, old, new
):
    operation = make_operation(state=old, provider_reference="r")
    sql = (
        "UPDATE tasks_operation SET state = %s, state_version = state_version + 1 "
        "WHERE id = %s"
    )
    if old == new or (old, new) in OPERATION_TRANSITIONS:
        assert execute(sql, [new, operation.pk]) == 1
    else:
        with refused_by("tasks_operation_transition_trg"):
            execute(sql, [new, operation.pk])


@pytest.mark.parametrize("delta", [0, 2, -1, 10])
def test_a_task_state_change_must_raise_state_version_by_exactly_one(make_task, delta):
    task = make_task(state=TaskState.PENDING)
    with refused_by("tasks_task_state_version_trg"):
        execute(
            "UPDATE tasks_task SET state = 'running', state_version = state_version + %s "
            "WHERE id = %s",
            [delta, task.pk],
        )


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("current_step", "'step-2'"),
        ("reason_code", "'FIELD_STALE'"),
        ("wake_at", "now()"),
    ],
)
def test_a_step_reason_or_wake_change_without_a_version_bump_is_refused(
    make_task, column, value
):
    task = make_task(state=TaskState.RUNNING)
    with refused_by("tasks_task_state_version_trg"):
        execute(f"UPDATE tasks_task SET {column} = {value} WHERE id = %s", [task.pk])


def test_state_version_cannot_move_alone_by_more_than_one(make_task):
    task = make_task()
    with refused_by("tasks_task_state_version_trg"):
        execute("UPDATE tasks_task SET state_version = 7 WHERE id = %s", [task.pk])


def test_operation_state_change_must_raise_state_version_by_one(make_operation):
    operation = make_operation(state=OperationState.RESERVED)
    with refused_by("tasks_operation_state_version_trg"):
        execute(
            "UPDATE tasks_operation SET state = 'executing' WHERE id = %s",
            [operation.pk],
        )


def test_lease_columns_change_without_a_version_bump(make_task):
    """A lease is not a state change: renewing it leaves state_version alone."""
    task = make_task(state=TaskState.RUNNING, leased=True)
    assert (
        execute(
            "UPDATE tasks_task SET lease_expires_at = lease_expires_at + interval '1 minute'"
            " WHERE id = %s",
            [task.pk],
        )
        == 1
    )
    task.refresh_from_db()
    assert task.state_version == 1


def test_the_fencing_token_never_falls(make_task):
    """Invariant 6 (DB half): a lease token can rise, never fall."""
    task = make_task(state=TaskState.RUNNING, leased=True, lease_token=5)
    with refused_by("tasks_task_lease_token_trg"):
        execute("UPDATE tasks_task SET lease_token = 4 WHERE id = %s", [task.pk])
    assert (
        execute("UPDATE tasks_task SET lease_token = 6 WHERE id = %s", [task.pk]) == 1
    )


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("idempotency_key", "'other'"),
        ("input_hash", "'f00d'"),
        ("action", "'x'"),
        ("target", "'y'"),
    ],
)
def test_an_operations_identity_cannot_change(make_operation, column, value):
    operation = make_operation()
    with refused_by("tasks_operation_identity_trg"):
        execute(
            f"UPDATE tasks_operation SET {column} = {value} WHERE id = %s",
            [operation.pk],
        )
