"""Two roles, and the privileged paths only the owner can take (issue 9, sections 1-2).

The tests' connection is the app role's (tests/conftest.py). Each old bypass is tried
as that role and must be refused: the purge and clock settings, disabling a trigger,
TRUNCATE, UPDATE and DELETE on events. The triggers are the second wall: a superuser's
transaction grants the app role the missing privilege, becomes it, and the trigger
still refuses. The catalog audit fails for a new table the grants do not cover.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection, transaction
from psycopg import sql

from audit import services as audit_services
from audit.models import Event, EventCode
from portal import db_roles
from portal.actors import Actor
from tests.support.db import connect_as

from .conftest import execute, refused_for_privilege

APP, OWNER = db_roles.APP_ROLE, db_roles.OWNER_ROLE
GUARDED = ("audit_event", "audit_outbox", "tasks_operation")


def _event(tenant) -> Event:
    with transaction.atomic():
        event_id = audit_services.event_append(
            tenant_id=tenant.pk, code=EventCode.TASK_REGISTERED, actor=Actor.system("t")
        )
    return Event.objects.get(pk=event_id)


def _rows(query: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall()


# --- The catalog ----------------------------------------------------------------------


def test_the_tests_run_as_the_app_role(db):
    assert _rows("SELECT current_user, session_user") == [(APP, APP)]


def test_the_app_role_is_no_owner_superuser_or_bypass(db):
    ((superuser, bypass, createrole, createdb),) = _rows(
        "SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb FROM pg_roles"
        " WHERE rolname = current_user"
    )
    assert not (superuser or bypass or createrole or createdb)
    ((member_of_owner,),) = _rows(
        "SELECT pg_has_role(current_user, %s, 'MEMBER')", [OWNER]
    )
    assert not member_of_owner
    owned = _rows(
        """
        SELECT c.relname FROM pg_class c WHERE c.relowner = current_user::regrole
        UNION ALL
        SELECT p.proname FROM pg_proc p WHERE p.proowner = current_user::regrole
        UNION ALL
        SELECT n.nspname FROM pg_namespace n WHERE n.nspowner = current_user::regrole
        """
    )
    assert owned == []


def test_the_owner_owns_every_table_and_function_of_the_schema(db):
    """All but the discovery functions, which the discovery role owns
    (tests/db/test_row_level_security.py pins them)."""
    foreign = _rows(
        """
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relowner <> %s::regrole
        UNION ALL
        SELECT p.oid::regprocedure::text FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.proowner <> %s::regrole
        ORDER BY 1
        """,
        [OWNER, OWNER],
    )
    assert [row[0] for row in foreign] == sorted(db_roles.DISCOVERY_FUNCTIONS)


def test_the_app_role_holds_only_the_rights_it_uses(db):
    """No TRUNCATE, TRIGGER or REFERENCES anywhere; events append-only; no DDL."""
    excess = _rows(
        """
        SELECT c.relname, p.privilege FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        CROSS JOIN unnest(ARRAY['TRUNCATE', 'TRIGGER', 'REFERENCES']) AS p(privilege)
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
          AND has_table_privilege(current_user, c.oid, p.privilege)
        UNION ALL
        SELECT t.name, p.privilege
        FROM unnest(ARRAY['audit_event', 'audit_checkpoint']) AS t(name)
        CROSS JOIN unnest(ARRAY['UPDATE', 'DELETE']) AS p(privilege)
        WHERE has_table_privilege(current_user, t.name, p.privilege)
        UNION ALL
        SELECT t.name, p.privilege
        FROM unnest(ARRAY['django_migrations', 'portal_test_clock',
                          'audit_retentionpurge', 'audit_retentionanchor']) AS t(name)
        CROSS JOIN unnest(ARRAY['INSERT', 'UPDATE', 'DELETE']) AS p(privilege)
        WHERE has_table_privilege(current_user, t.name, p.privilege)
        UNION ALL
        SELECT 'portal_tenant.' || c.name, 'UPDATE'
        FROM unnest(ARRAY['events_on_delete', 'deleted_at']) AS c(name)
        WHERE has_column_privilege(current_user, 'portal_tenant', c.name, 'UPDATE')
        UNION ALL
        SELECT 'audit_chainhead', 'DELETE'
        WHERE has_table_privilege(current_user, 'audit_chainhead', 'DELETE')
        UNION ALL
        SELECT 'tenant_deletion_purge', 'EXECUTE'
        WHERE has_function_privilege(
            current_user, 'tenant_deletion_purge(uuid)', 'EXECUTE')
        UNION ALL
        SELECT 'schema public', 'CREATE'
        WHERE has_schema_privilege(current_user, 'public', 'CREATE')
        """
    )
    assert excess == []


def test_only_the_operator_executes_the_purge_and_changes_the_policy(db):
    """docs/tenant-deletion.md: the operator role, and no other login role but
    the owner, may run the purge or change what it decides by."""
    rows = _rows(
        """
        SELECT r.rolname,
               has_function_privilege(r.oid, 'tenant_deletion_purge(uuid)',
                                      'EXECUTE'),
               has_column_privilege(r.oid, 'portal_tenant', 'events_on_delete',
                                    'UPDATE'),
               has_column_privilege(r.oid, 'portal_tenant', 'deleted_at', 'UPDATE')
        FROM pg_roles r WHERE r.rolname IN (%s, %s, %s) ORDER BY 1
        """,
        [APP, db_roles.OPERATOR_ROLE, db_roles.DISCOVERY_ROLE],
    )
    assert rows == [
        (APP, False, False, False),
        (db_roles.DISCOVERY_ROLE, False, False, False),
        (db_roles.OPERATOR_ROLE, True, True, False),
    ]
    ((superuser, bypass, createrole, createdb, member),) = _rows(
        "SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb,"
        " pg_has_role(rolname, %s, 'MEMBER') FROM pg_roles WHERE rolname = %s",
        [OWNER, db_roles.OPERATOR_ROLE],
    )
    assert not (superuser or bypass or createrole or createdb or member)


def test_every_table_is_usable_by_the_app_role(db):
    """The grants cover every table, a new one included (migrate re-applies them)."""
    missing = _rows(
        """
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
          AND NOT c.relispartition  -- reached through the parent (RLS tests)
          AND NOT has_table_privilege(current_user, c.oid, 'SELECT')
        """
    )
    assert missing == []


def test_a_new_table_gets_the_app_grants_and_no_more(db):
    """What ``manage.py migrate`` does for a table a future migration adds."""
    with connect_as("owner") as owner, owner.cursor() as cursor:
        cursor.execute("CREATE TABLE rls_probe_new (id int)")
        db_roles.grant_app_role(cursor, test_clock=False)
        cursor.execute(
            "SELECT has_table_privilege(%s, 'rls_probe_new', 'INSERT'),"
            " has_table_privilege(%s, 'rls_probe_new', 'TRUNCATE')",
            [APP, APP],
        )
        assert cursor.fetchone() == (True, False)
        owner.rollback()


def test_migrate_grants_database_urls_user_while_connected_as_the_owner(settings):
    """Production: DATABASE_URL is the app role's, DATABASE_OWNER_URL the owner's."""
    settings.DATABASE_APP_ROLE = ""
    settings.DATABASE_URL = "postgres://portal_app@127.0.0.1:5432/portal"
    settings.DATABASE_OWNER_URL = "postgres://portal_owner@127.0.0.1:5432/portal"
    with db_roles.connected_as("default", db_roles.owner_url()) as connection:
        assert connection.settings_dict["USER"] == OWNER
        assert db_roles.app_role() == APP


def test_the_privileged_functions_are_not_executable_by_public(db):
    """EXECUTE on the definer functions goes to the app role alone, by name."""
    rows = _rows(
        """
        SELECT p.proname, p.proowner::regrole::text,
               has_function_privilege('public', p.oid, 'EXECUTE')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.prosecdef
        ORDER BY 1
        """
    )
    discovery = db_roles.DISCOVERY_ROLE
    assert rows == [
        ("audit_event_partition_create", OWNER, False),
        ("audit_event_partitions_ensure", OWNER, False),
        ("audit_retention_drop_partitions", OWNER, False),
        ("audit_retention_drop_payloads", OWNER, False),
        ("audit_retention_purge", OWNER, False),
        ("audit_tenants_with_due_outbox", discovery, False),
        ("audit_tenants_with_log", discovery, False),
        ("portal_agent_key_tenant", discovery, False),
        ("portal_invitation_tenant", discovery, False),
        ("portal_person_tenants", discovery, False),
        ("portal_reset_clock_offset", OWNER, False),
        ("portal_set_clock_offset", OWNER, False),
        ("portal_tenants_with_expired_idempotency", discovery, False),
        ("routing_tenants_with_due_work", discovery, False),
        ("tasks_tenants_with_due_operations", discovery, False),
        ("tasks_tenants_with_lapsed_leases", discovery, False),
        ("tasks_tenants_with_waking_tasks", discovery, False),
        ("tenant_deletion_purge", OWNER, False),
    ]


def test_the_app_role_executes_only_the_retention_entry_points(db):
    """Retention (docs/retention.md): the beat jobs' four functions, never the
    partition DDL or the trigger-disabling helper they call as the owner."""
    rows = _rows(
        """
        SELECT p.proname, has_function_privilege(%s, p.oid, 'EXECUTE')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public'
          AND (p.proname LIKE 'audit\\_retention\\_%%'
               OR p.proname LIKE 'audit\\_event\\_partition%%')
          AND (p.prosecdef OR p.proname = 'audit_retention_unguarded')
        ORDER BY 1
        """,
        [APP],
    )
    assert rows == [
        ("audit_event_partition_create", False),
        ("audit_event_partitions_ensure", True),
        ("audit_retention_drop_partitions", True),
        ("audit_retention_drop_payloads", True),
        ("audit_retention_purge", True),
        ("audit_retention_unguarded", False),
    ]


# --- Each old bypass, as the app role -------------------------------------------------


def test_the_purge_setting_opens_nothing(tenant):
    event = _event(tenant)
    execute("SET LOCAL portal.purge = 'on'")
    with refused_for_privilege():
        execute("DELETE FROM audit_event WHERE id = %s", [event.pk])
    assert Event.objects.filter(pk=event.pk).exists()


@pytest.mark.parametrize("setting", ["portal.clock_offset", "portal.test_clock"])
def test_a_clock_setting_moves_no_clock(db, setting):
    for is_local in (False, True):
        execute("SELECT set_config(%s, '1 hour', %s)", [setting, is_local])
        (shift,) = _rows("SELECT app_now() - statement_timestamp()")[0]
        assert shift == dt.timedelta(0)
    execute(f"RESET {setting}")


def test_the_test_clock_moves_only_through_the_owner_function(db):
    execute("SELECT portal_set_clock_offset('1 hour')")
    try:
        assert _rows("SELECT app_now() - statement_timestamp()") == [
            (dt.timedelta(hours=1),)
        ]
        with refused_for_privilege():
            execute("UPDATE portal_test_clock SET clock_offset = '2 hours'")
    finally:
        execute("SELECT portal_reset_clock_offset()")
    assert _rows("SELECT app_now() - statement_timestamp()") == [(dt.timedelta(0),)]


@pytest.mark.parametrize("table", GUARDED)
def test_disabling_a_trigger_is_refused(db, table):
    with refused_for_privilege():
        execute(f"ALTER TABLE {table} DISABLE TRIGGER ALL")
    with refused_for_privilege():
        execute(f"ALTER TABLE {table} DISABLE TRIGGER {table}_truncate_trg")


@pytest.mark.parametrize("table", GUARDED)
def test_truncate_is_refused(db, table):
    with refused_for_privilege():
        execute(f"TRUNCATE {table} CASCADE")


def test_the_app_role_cannot_run_the_purge(tenant):
    """Not even for a tenant it may see; the old function is gone."""
    with refused_for_privilege():
        execute("SELECT * FROM tenant_deletion_purge(%s)", [tenant.pk])
    assert _rows(
        "SELECT count(*) FROM pg_proc WHERE proname = 'tasks_purge_tenant_rows'"
    ) == [(0,)]


# --- The triggers, the second wall ----------------------------------------------------


@contextmanager
def app_role_granted(privilege: str) -> Iterator[psycopg.Connection]:
    """A superuser's transaction: grant the app role ``privilege`` on every table,
    become it.

    Rolled back at the end, grant included.
    """
    with connect_as("admin") as conn:
        # On every table: TRUNCATE ... CASCADE checks the referencing ones too.
        conn.execute(
            sql.SQL("GRANT {} ON ALL TABLES IN SCHEMA public TO {}").format(
                sql.SQL(privilege), sql.Identifier(APP)
            )
        )
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(APP)))
        yield conn
        conn.rollback()


@pytest.mark.parametrize("table", GUARDED)
def test_the_truncate_trigger_refuses_even_with_the_privilege(db, table):
    with (
        app_role_granted("TRUNCATE") as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege) as caught,
    ):
        conn.execute(sql.SQL("TRUNCATE {} CASCADE").format(sql.Identifier(table)))
    assert caught.value.diag.constraint_name == f"{table}_truncate_trg"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("privilege", "statement"),
    [
        ("UPDATE", "UPDATE audit_event SET actor_id = 'forged' WHERE id = %s"),
        ("DELETE", "DELETE FROM audit_event WHERE id = %s"),
    ],
)
def test_the_event_trigger_refuses_even_with_the_privilege(
    tenant, privilege, statement
):
    event = _event(tenant)
    with app_role_granted(privilege) as conn:
        conn.execute("SET LOCAL portal.purge = 'on'")  # the old key opens nothing
        conn.execute(  # the tenant's scope: row-level security shows the rows
            "SELECT set_config('portal.tenant_ids', %s, true)", [str(tenant.pk)]
        )
        conn.execute("DELETE FROM audit_outbox WHERE event_id = %s", [event.pk])
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation) as caught:
            conn.execute(statement, [event.pk])
    assert caught.value.diag.constraint_name == "audit_event_append_only_trg"
    assert Event.objects.filter(pk=event.pk, actor_id="t").exists()
