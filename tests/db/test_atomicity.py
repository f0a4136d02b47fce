"""Invariant 4: a state change, its event and its outbox row commit together or not at all.

A temporary trigger makes the event (or outbox) insert fail *after* the state UPDATE
already ran in the same transaction; nothing of the three may survive.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg import sql

from audit.models import Event, Outbox
from portal.exceptions import IntegrityViolation
from tasks import services
from tasks.models import Task, TaskState
from tests.support.db import connect_as

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["audit_event", "audit_outbox"])
def failing_insert(request) -> Iterator[str]:
    """The fault trigger, made and dropped by the owner (DDL is not the app's)."""
    table = request.param
    with connect_as("owner", autocommit=True) as owner:
        owner.execute(
            """
            CREATE FUNCTION test_fail_insert() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'injected fault' USING ERRCODE = 'check_violation',
                    CONSTRAINT = 'test_injected_fault';
            END $$
            """
        )
        owner.execute(
            sql.SQL(
                "CREATE TRIGGER test_fail_insert BEFORE INSERT ON {} "
                "FOR EACH ROW EXECUTE FUNCTION test_fail_insert()"
            ).format(sql.Identifier(table))
        )
        try:
            yield table
        finally:
            owner.execute(
                sql.SQL("DROP TRIGGER test_fail_insert ON {}").format(
                    sql.Identifier(table)
                )
            )
            owner.execute("DROP FUNCTION test_fail_insert()")


def test_a_failed_event_write_rolls_the_transition_back(
    make_task, actor, failing_insert
):
    task = make_task(state=TaskState.RUNNING, leased=True)
    with pytest.raises(IntegrityViolation):
        services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=1,
            lease_token=task.lease_token,
            actor=actor,
        )
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (TaskState.RUNNING, 1)
    assert not Event.objects.exists()
    assert not Outbox.objects.exists()


def test_a_failed_event_write_rolls_the_claim_back(make_task, actor, failing_insert):
    task = make_task(state=TaskState.PENDING)
    with pytest.raises(IntegrityViolation):
        services.task_claim_next(tenant=task.tenant, owner="w", actor=actor)
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.lease_owner, stored.lease_token) == (
        TaskState.PENDING,
        None,
        0,
    )
    assert not Event.objects.exists()


def test_a_failed_event_write_rolls_the_reservation_back(
    make_task, actor, failing_insert
):
    task = make_task(state=TaskState.RUNNING, leased=True)
    with pytest.raises(IntegrityViolation):
        services.operation_reserve(
            tenant=task.tenant,
            task_id=task.pk,
            lease_token=task.lease_token,
            idempotency_key="k",
            action="a",
            target="t",
            input={},
            actor=actor,
        )
    assert not task.operations.exists()
    assert not Event.objects.exists()
