"""Transaction pooling does not carry one client's tenant scope, prepared statements
or timeouts to another (docs/operations.md, "PgBouncer")."""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from portal import db_roles, scope
from portal.models import Agent, AgentGrant, Tenant
from tasks.models import Task
from tests.support import pgbouncer
from tests.support.db import conninfo
from tests.support.pgbouncer import PgBouncer

from .conftest import portal_options, start

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 8
ROUNDS = 25
SETTING = "SELECT current_setting('portal.tenant_ids', true)"


def _setting() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(SETTING)
        return cursor.fetchone()[0]


def _backend() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _run_clients(target: Callable[[int], None], count: int) -> None:
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            target(index)
        except BaseException as error:  # reported by the test thread  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()  # this thread's own Django connection

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors


def test_tenant_scopes_do_not_leak_between_clients_sharing_server_connections(
    through_bouncer: PgBouncer,
    make_tenant: Callable[..., Tenant],
    make_agent: Callable[..., Agent],
) -> None:
    # Given: CLIENTS tenants with an agent of two grants each (portal_agentgrant
    # has row-level security), and as many clients (threads, each with its own
    # Django connection) as tenants, through a pool of 2 server connections.
    tenants = [make_tenant() for _ in range(CLIENTS)]
    for tenant in tenants:
        make_agent(tenant=tenant, grants=("a", "b"))
    seen: dict[int, list[Any]] = defaultdict(list)
    clients_of_backend: dict[int, set[int]] = defaultdict(set)
    lock = threading.Lock()

    def client(index: int) -> None:
        tenant_id = str(tenants[index].pk)
        for _ in range(ROUNDS):
            # A transaction without a scope: nothing of anyone else's is set.
            with transaction.atomic():
                unscoped = (_setting(), AgentGrant.objects.count(), _backend())
            # The same client's transaction in its tenant's scope.
            with scope.tenant_scope([tenant_id]), transaction.atomic():
                scoped = (
                    _setting(),
                    {
                        str(t)
                        for t in AgentGrant.objects.values_list("tenant_id", flat=True)
                    },
                    _backend(),
                )
            # And an autocommit read in scope (a transaction of its own).
            with scope.tenant_scope([tenant_id]):
                autocommit = AgentGrant.objects.count()
            with lock:
                seen[index].append((unscoped, scoped, autocommit))
                clients_of_backend[unscoped[2]].add(index)
                clients_of_backend[scoped[2]].add(index)

    # When: they all run at once.
    _run_clients(client, CLIENTS)

    # Then: every transaction started with no scope but its own, and row-level
    # security showed each client its own tenant's rows only.
    for index, rounds in seen.items():
        tenant_id = str(tenants[index].pk)
        assert len(rounds) == ROUNDS
        for unscoped, scoped, autocommit in rounds:
            assert unscoped[0] in ("", None), (index, unscoped)
            assert unscoped[1] == 0, (index, unscoped)
            assert scoped[0] == tenant_id and scoped[1] == {tenant_id}, (index, scoped)
            assert autocommit == 2
    # And: the clients really shared the server connections (pigeonhole: eight
    # clients on at most two backends).
    assert 1 <= len(clients_of_backend) <= 2, clients_of_backend
    assert max(len(c) for c in clients_of_backend.values()) >= CLIENTS // 2


def test_a_session_wide_setting_would_leak_which_is_why_the_scope_is_local(
    tenant: Tenant, make_agent: Callable[..., Agent]
) -> None:
    """The check above can fail: a ``set_config(…, false)`` (session-wide) through
    a pool of one server connection reaches the next client, rows and all."""
    make_agent(tenant=tenant, grants=("a",))
    with start(pool_size=1) as bouncer:
        params = bouncer.conninfo(
            user=db_roles.APP_ROLE, dbname=connection.settings_dict["NAME"]
        )
        with (
            psycopg.connect(**params, autocommit=True) as first,
            psycopg.connect(**params, autocommit=True) as second,
        ):
            first.execute(
                "SELECT set_config('portal.tenant_ids', %s, false)", [str(tenant.pk)]
            )
            leaked = second.execute(SETTING).fetchone()
            rows = second.execute("SELECT count(*) FROM portal_agentgrant").fetchone()
    assert leaked == (str(tenant.pk),)
    assert rows == (1,)


def test_the_startup_timeouts_reach_the_server_through_connect_query(
    through_bouncer: PgBouncer,
) -> None:
    # Given: PgBouncer refuses the ``options`` startup parameter unless told to
    # ignore it (and then drops it).
    options = portal_options()["options"]
    with start(ignore_startup_parameters=("extra_float_digits",)) as strict:
        params = strict.conninfo(
            user=db_roles.APP_ROLE, dbname=connection.settings_dict["NAME"]
        )
        with pytest.raises(psycopg.OperationalError, match="unsupported startup"):
            psycopg.connect(**params, options=options).close()
    # When: the portal's connection goes through the documented PgBouncer, and one
    # goes straight to PostgreSQL with the settings' options.
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        pooled = [cursor.fetchone()[0]]
        cursor.execute("SHOW statement_timeout")
        pooled.append(cursor.fetchone()[0])
    with psycopg.connect(**conninfo(user=db_roles.APP_ROLE), options=options) as direct:
        expected = [
            direct.execute("SELECT current_setting('lock_timeout')").fetchall()[0][0],
            direct.execute("SELECT current_setting('statement_timeout')").fetchall()[0][
                0
            ],
        ]
    # Then: the same timeouts, set by connect_query on each server connection.
    assert expected != ["0", "0"]
    assert pooled == expected


def _prepared_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert row is not None
    return int(row[0])


def test_named_prepared_statements_and_transaction_pooling(
    bouncer: PgBouncer,
) -> None:
    """Two clients on one server connection, each preparing its statements (as
    psycopg does with a prepare threshold): PgBouncer 1.21+ with
    ``max_prepared_statements`` keeps them apart; older ones let them collide,
    which is why the portal turns server-side binding off behind them."""
    query = "SELECT count(*) FROM tasks_task WHERE tenant_id = %s"
    with start(pool_size=1) as single:
        params = single.conninfo(
            user=db_roles.APP_ROLE, dbname=connection.settings_dict["NAME"]
        )
        with (
            psycopg.connect(**params, prepare_threshold=0) as first,
            psycopg.connect(**params, prepare_threshold=0) as second,
        ):
            first.execute(query, [uuid.uuid4()])
            first.commit()
            if pgbouncer.keeps_prepared_statements():
                for _ in range(3):
                    second.execute(query, [uuid.uuid4()])
                    first.execute(query, [uuid.uuid4()])
                assert _prepared_count(second) >= 1
            else:
                with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
                    second.execute(query, [uuid.uuid4()])


def test_the_portal_prepares_nothing_pgbouncer_cannot_keep(
    through_bouncer: PgBouncer, tenant: Tenant
) -> None:
    """With the documented settings, the portal's own connections run the same
    statement many times through the pool; on PgBouncer before 1.21 none is
    prepared on the server even with psycopg's most eager threshold."""
    options = connection.settings_dict["OPTIONS"]
    connection.settings_dict["OPTIONS"] = {**options, "prepare_threshold": 0}
    try:
        counts: list[tuple[int, int]] = []

        def client(index: int) -> None:
            with scope.tenant_scope([tenant.pk]), transaction.atomic():
                for _ in range(10):
                    Task.objects.filter(object_id="x").count()
                connection.ensure_connection()
                raw = connection.connection
                assert raw is not None
                counts.append((_prepared_count(raw), len(raw._prepared._names)))

        _run_clients(client, 4)
    finally:
        connection.settings_dict["OPTIONS"] = options
    if pgbouncer.keeps_prepared_statements():
        assert all(server >= 1 for server, _ in counts), counts
    else:
        assert counts == [(0, 0)] * 4


def test_the_prepared_statement_check_sees_prepared_statements(
    transactional_db: None, tenant: Tenant
) -> None:
    """The control of the test above: straight to PostgreSQL, server-side
    binding and a threshold of 0 do prepare, and both counts show it."""
    with psycopg.connect(
        **conninfo(user=db_roles.APP_ROLE), prepare_threshold=0
    ) as conn:
        for _ in range(3):
            conn.execute("SELECT count(*) FROM tasks_task WHERE object_id = %s", ["x"])
        assert _prepared_count(conn) >= 1
        assert len(conn._prepared._names) >= 1
