"""``scope.one_round_trip``: one statement, its own transaction, the tenant scope set.

The scope's ``set_config`` and the statement go down in one pipeline closed by one
Sync; PostgreSQL runs both in one implicit transaction. These tests show the setting
reaching the statement and ending with it, row-level security applying, and a failed
statement leaving nothing behind.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from portal import scope
from portal.models import Tenant
from tasks.models import Task

pytestmark = pytest.mark.django_db(transaction=True)

SETTING_AND_XACT = (
    "SELECT current_setting('portal.tenant_ids', true), txid_current(),"
    " (SELECT txid_current())"
)


def test_the_scope_reaches_the_statement_and_ends_with_it(tenant: Tenant) -> None:
    with scope.tenant_scope([tenant.pk]):
        ((setting, xact, _),) = scope.one_round_trip(SETTING_AND_XACT, {})
        assert setting == str(tenant.pk)
        ((_again, next_xact, _),) = scope.one_round_trip(SETTING_AND_XACT, {})
    assert next_xact != xact  # each call is a transaction of its own
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('portal.tenant_ids', true)")
        assert cursor.fetchone() in {("",), (None,)}  # nothing stays on the session


def test_row_level_security_applies(make_task, tenant, other_tenant) -> None:
    mine = make_task(tenant=tenant)
    theirs = make_task(tenant=other_tenant)
    sql = "SELECT id FROM tasks_task WHERE id = ANY(%(ids)s)"
    with scope.tenant_scope([tenant.pk]):
        rows = scope.one_round_trip(sql, {"ids": [mine.pk, theirs.pk]})
    assert rows == [(mine.pk,)]


def test_a_failed_statement_rolls_back_alone(make_task, tenant) -> None:
    task = make_task(tenant=tenant)
    # the first UPDATE runs, the second statement part fails: nothing stays
    sql = (
        "WITH moved AS (UPDATE tasks_task SET current_step = 'changed'"
        " WHERE id = %(id)s RETURNING id)"
        " INSERT INTO tasks_task (id) SELECT id FROM moved"
    )
    with scope.tenant_scope([tenant.pk]), pytest.raises(IntegrityError):
        scope.one_round_trip(sql, {"id": task.pk})
    assert Task.objects.get(pk=task.pk).current_step == ""
    with scope.tenant_scope([tenant.pk]):
        assert scope.one_round_trip("SELECT 1", {}) == [(1,)]  # the session is fine


def test_it_refuses_to_run_inside_a_transaction(tenant) -> None:
    with transaction.atomic(), pytest.raises(RuntimeError):
        scope.one_round_trip("SELECT 1", {})



def test_a_statement_that_returns_no_rows_gives_an_empty_list(make_task, tenant):
    task = make_task(tenant=tenant)
    with scope.tenant_scope([tenant.pk]):
        # a command with no result set (PostgreSQL answers COMMAND_OK)
        assert scope.one_round_trip("SET LOCAL statement_timeout = '5s'", {}) == []
        # a query that matches nothing: no rows, not an error
        none = "SELECT id FROM tasks_task WHERE id = %(id)s AND state = 'no-such'"
        assert scope.one_round_trip(none, {"id": task.pk}) == []
        mine = "SELECT id FROM tasks_task WHERE id = %(id)s"
        assert scope.one_round_trip(mine, {"id": task.pk}) == [(task.pk,)]
