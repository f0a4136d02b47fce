"""A scoped transaction begins in one round trip, and is a transaction like any other.

``portal/dbbackend`` sends ``BEGIN`` and the tenant scope's ``set_config`` as one
simple query and leaves psycopg in its autocommit mode for the transaction. These
tests read the wire protocol (libpq's trace) for the round trips, and check with the
server that commit, rollback, savepoints, server-side cursors and a transaction begun
without a scope all still behave. The health check of a kept connection (Django's
``CONN_HEALTH_CHECKS``, at the first query of every request) sends nothing while the
connection is idle, and still notices a connection the server ended.
"""

from __future__ import annotations

import select
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from portal import scope
from portal.models import Agent, AgentGrant, Tenant


@contextmanager
def wire() -> Iterator[list[str]]:
    """The frontend messages that end a round trip (``Query``, ``Sync``), in order."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    messages: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        with path.open("w") as sink:
            pgconn.trace(sink.fileno())
            pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                yield messages
            finally:
                pgconn.untrace()
        for line in path.read_text().splitlines():
            direction, _, kind, *rest = line.split("\t")
            if direction == "F" and kind.strip() in ("Query", "Sync"):
                messages.append(f"{kind.strip()} {' '.join(rest).strip()}".strip())


def _setting_and_status() -> tuple[str, bool]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('portal.tenant_ids', true),"
            " now() <> statement_timestamp()"  # true: an earlier statement began it
        )
        setting, in_transaction = cursor.fetchone()
        return setting or "", in_transaction


@pytest.mark.django_db(transaction=True)
def test_a_scoped_transaction_begins_in_one_round_trip(tenant):
    with scope.tenant_scope([tenant.pk]), wire() as messages, transaction.atomic():
        setting, in_transaction = _setting_and_status()
    assert (setting, in_transaction) == (str(tenant.pk), True)
    assert len(messages) == 3, messages  # BEGIN + scope, the statement, COMMIT
    assert (
        messages[0].startswith("Query") and "BEGIN; SELECT set_config(" in messages[0]
    )
    assert messages[-1] == 'Query "COMMIT"'


@pytest.mark.django_db(transaction=True)
def test_without_a_scope_psycopg_begins_the_transaction_as_before(tenant):
    with scope.unit_of_work(), wire() as messages, transaction.atomic():
        assert _setting_and_status() == ("", True)
    assert messages[0] == 'Query "BEGIN"' and messages[-1] == 'Query "COMMIT"'
    assert len(messages) == 3, messages


@transaction.atomic
def _grant_then_fail(tenant: Tenant, agent: Agent) -> None:
    AgentGrant.objects.create(tenant_id=tenant.pk, agent=agent, action="a", target="t")
    raise RuntimeError("roll it back")


@pytest.mark.django_db(transaction=True)
def test_rollback_and_savepoints_in_a_scoped_transaction(tenant, make_agent):
    agent = make_agent(tenant=tenant)
    with scope.tenant_scope([tenant.pk]):
        before = AgentGrant.objects.count()
        with pytest.raises(RuntimeError, match="roll it back"):
            _grant_then_fail(tenant, agent)
        assert AgentGrant.objects.count() == before
        # an error the server raises, caught in a savepoint; the outer block commits
        with transaction.atomic():
            AgentGrant.objects.create(
                tenant_id=tenant.pk, agent=agent, action="b", target="t"
            )
            with (
                pytest.raises(DatabaseError),
                transaction.atomic(),
                connection.cursor() as cursor,
            ):
                cursor.execute("SELECT 1 / 0")
            AgentGrant.objects.create(
                tenant_id=tenant.pk, agent=agent, action="c", target="t"
            )
        assert AgentGrant.objects.count() == before + 2
    assert (
        connection.connection.info.transaction_status
        == psycopg.pq.TransactionStatus.IDLE
    )


@pytest.mark.django_db(transaction=True)
def test_a_transaction_begun_without_a_scope_then_a_scoped_one(tenant):
    with scope.unit_of_work():
        with transaction.atomic():
            scope.enter([tenant.pk])  # authentication does this halfway through
            assert _setting_and_status() == (str(tenant.pk), True)
        with transaction.atomic():
            assert _setting_and_status() == (str(tenant.pk), True)
    with scope.unit_of_work():
        assert _setting_and_status()[0] == ""


@pytest.mark.django_db(transaction=True)
def test_a_server_side_cursor_in_a_scoped_transaction_is_not_held(tenant, make_agent):
    agent = make_agent(tenant=tenant)
    for number in range(3):
        AgentGrant.objects.create(
            tenant_id=tenant.pk, agent=agent, action=f"a{number}", target="t"
        )
    with scope.tenant_scope([tenant.pk]), transaction.atomic():
        total = AgentGrant.objects.filter(agent=agent).count()
        rows = AgentGrant.objects.filter(agent=agent).iterator(chunk_size=1)
        assert next(rows) is not None
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT is_holdable FROM pg_cursors WHERE name LIKE '_django%%'"
            )
            assert cursor.fetchall() == [(False,)]
        assert len(list(rows)) == total - 1 >= 3


@pytest.mark.django_db(transaction=True)
def test_the_health_check_of_an_idle_connection_sends_nothing(tenant):
    # Given a kept connection, idle between two requests
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    # When the next request's health check asks whether it is usable
    with wire() as messages:
        usable = connection.is_usable()
    # Then it is, and no message went to the server (Django's own check is a
    # SELECT 1, a round trip)
    assert usable
    assert messages == []


@pytest.mark.django_db(transaction=True)
def test_the_health_check_notices_a_connection_the_server_ended(tenant):
    # Given a kept, idle connection whose backend the server then terminates
    connection.ensure_connection()
    raw = connection.connection
    pid = raw.info.backend_pid
    with psycopg.connect(
        settings.DATABASE_URL, dbname=connection.settings_dict["NAME"], autocommit=True
    ) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    try:
        # (the server's FATAL message and the close reach the socket)
        deadline = time.monotonic() + 10
        while not select.select([raw.fileno()], [], [], 0.05)[0]:
            assert time.monotonic() < deadline, "the server did not end the session"
        # When the next request's health check runs, as Django runs it
        connection.health_check_done = False
        connection.close_if_health_check_failed()
        # Then the dead connection was dropped, and the next query gets a new one
        assert connection.connection is None
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] != pid
    finally:
        connection.close()
