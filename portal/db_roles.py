"""Two database roles: the owner migrates, the app role runs (docs/database-roles.md).

The **owner** owns every table, function and trigger; ``manage.py migrate`` (and the
test suite's ``flush``) run as it, through ``DATABASE_OWNER_URL``. The **app role**
(``DATABASE_URL``'s user) runs web, workers, beat and every other command: it owns
nothing, is not superuser, has no ``BYPASSRLS`` and holds only the rights listed in
``APP_GRANTS``, which every migrate re-applies, so a new table is covered without a
migration having to remember it.

The **operator** (``DATABASE_OPERATOR_URL``'s user, ``portal_operator``) is the one
role that may run the tenant purge (``tenant_deletion_purge``); only ``manage.py
delete_tenant`` connects as it. The app role cannot purge a trail nor write what the
purge decides by (a tenant's ``events_on_delete`` and ``deleted_at``).

``manage.py up``, ``manage.py test`` and ``.ci/run`` start from an administrator's URL
(the embedded server's ``postgres``, or DATABASE_URL when it names a role that may
create roles) and make the roles themselves with ``ensure_roles``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import sql

from portal import database_url

OWNER_ROLE: Final = "portal_owner"
APP_ROLE: Final = "portal_app"
# Runs ``manage.py delete_tenant`` and nothing else: the app's rights, the purge
# function and the tenant's ``events_on_delete`` (tenant_deletion migration 0001).
OPERATOR_ROLE: Final = "portal_operator"
# Owns the discovery functions (tasks/migrations/0015): NOLOGIN, BYPASSRLS, column
# SELECTs only; they return which tenants have work of one kind, nothing else.
DISCOVERY_ROLE: Final = "portal_discovery"
# The one way across tenants (docs/database-roles.md, "Work across tenants"): each
# returns tenant ids only; the work then runs under exactly that scope.
DISCOVERY_FUNCTIONS: Final = (
    "audit_tenants_with_due_outbox()",
    "audit_tenants_with_log()",
    "portal_agent_key_tenant(text,text)",
    "portal_invitation_tenant(text)",
    "portal_person_tenants(integer)",
    "portal_tenants_with_expired_idempotency()",
    "routing_tenants_with_due_work()",
    "tasks_tenants_with_due_operations()",
    "tasks_tenants_with_lapsed_leases()",
    "tasks_tenants_with_waking_tasks()",
)

# What the app role may do, applied after every migrate. Everything else is the
# owner's: no TRUNCATE, no DDL, no trigger switches, no UPDATE or DELETE on events
# and checkpoints (append-only; only the owner's purge function deletes them, run by
# the operator), and the migration history and the test clock are read-only. Of a
# tenant row the app role updates the slug, the name and the freeze (``frozen_at``,
# ``frozen_by``: docs/limits.md) only: ``events_on_delete`` and
# ``deleted_at`` are what the purge decides by (chosen at creation, an INSERT; changed
# by the operator). Chain head rows it moves forward but never deletes (verify_audit
# compares them with the events). Retention's purge records
# and anchors are written by the owner's ``audit_retention_purge`` alone (the app role
# reads them); a tenant's retention policy the app role keeps (DELETE too: a tenant
# deletion removes it, and a missing policy means the defaults, which an UPDATE could
# set as well). Only the four retention entry points are executable, never
# ``audit_event_partition_create`` or ``audit_retention_unguarded``. The discovery
# functions are the app role's way across tenants (docs/database-roles.md). Desk
# comments are append-only: inserted and read, never changed or deleted (the
# operator deletes a deleted tenant's, below).
APP_GRANTS: Final = """
GRANT USAGE ON SCHEMA public TO {app};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {app};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {app};
REVOKE UPDATE, DELETE ON audit_event, audit_checkpoint, audit_logentry, audit_treehead,
    audit_headstamp FROM {app};
REVOKE INSERT, UPDATE, DELETE ON django_migrations, portal_test_clock FROM {app};
REVOKE UPDATE ON portal_tenant FROM {app};
GRANT UPDATE (slug, name, frozen_at, frozen_by_id) ON portal_tenant TO {app};
REVOKE DELETE ON audit_chainhead FROM {app};
REVOKE UPDATE, DELETE ON console_deskcomment FROM {app};
REVOKE INSERT, UPDATE, DELETE ON audit_retentionpurge, audit_retentionanchor FROM {app};
REVOKE INSERT, UPDATE, DELETE ON tenant_deletion_tombstone,
    tenant_deletion_tombstonestamp FROM {app};
GRANT EXECUTE ON FUNCTION audit_event_partitions_ensure(integer) TO {app};
GRANT EXECUTE ON FUNCTION audit_retention_purge(uuid, uuid, integer) TO {app};
GRANT EXECUTE ON FUNCTION audit_retention_drop_partitions(integer) TO {app};
GRANT EXECUTE ON FUNCTION audit_retention_drop_payloads(uuid, integer) TO {app};
DO $grants$
DECLARE
    v_part record;
BEGIN
    -- The app role reaches events through the parent alone (its privileges are
    -- the ones checked); the partitions the migration made got the schema-wide
    -- grant above, so take it back. Partitions made later get none.
    FOR v_part IN SELECT name FROM audit_event_partitions() LOOP
        EXECUTE format('REVOKE ALL ON %I FROM {app}', v_part.name);
    END LOOP;
END $grants$;
""" + "".join(  # the discovery functions: the app role runs them, nobody else
    f"GRANT EXECUTE ON FUNCTION {function} TO {{app}};\n"
    for function in DISCOVERY_FUNCTIONS
)

# The operator deletes tenants (tenant_delete runs on its connection): the app's
# rights, the purge function, the one column it may change on a live tenant, and
# the purged tenant's signed tombstone (which the purge function requires) and its
# witnesses' cosignatures (after the purge commits).
OPERATOR_GRANTS: Final = (
    APP_GRANTS
    + """
GRANT UPDATE (events_on_delete) ON portal_tenant TO {app};
GRANT EXECUTE ON FUNCTION tenant_deletion_purge(uuid) TO {app};
GRANT INSERT ON tenant_deletion_tombstone, tenant_deletion_tombstonestamp TO {app};
GRANT DELETE ON console_deskcomment TO {app};
"""
)

# Only the test suite moves the database clock (docs/invariants.md, "The one clock").
TEST_CLOCK_GRANT: Final = """
GRANT EXECUTE ON FUNCTION portal_set_clock_offset(interval) TO {app};
GRANT EXECUTE ON FUNCTION portal_reset_clock_offset() TO {app};
"""


def app_role() -> str:
    """The app role's name: DATABASE_URL's user, or the one tests and ``up`` chose.

    From the URL, not the connection's settings: while migrating, those are the
    owner's.
    """
    chosen = getattr(settings, "DATABASE_APP_ROLE", "")
    return str(chosen or database_url.parse(settings.DATABASE_URL).get("USER") or "")


def owner_url() -> str:
    """The owner's URL; DATABASE_URL itself when no owner URL is configured."""
    return str(getattr(settings, "DATABASE_OWNER_URL", "") or settings.DATABASE_URL)


def operator_url() -> str:
    """The operator's URL: ``DATABASE_OPERATOR_URL``, else DATABASE_URL's server as
    the operator role (development and tests, where local connections are trusted).
    """
    configured = str(getattr(settings, "DATABASE_OPERATOR_URL", "") or "")
    return configured or url_as(settings.DATABASE_URL, user=OPERATOR_ROLE)


def url_as(url: str, *, user: str) -> str:
    """``url`` with its user replaced (no password: local trust or peer auth);
    every host of a multi-host URL kept."""
    if database_url.is_multi_host(url):
        return database_url.with_user(url, user=user)
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{quote(user)}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _conninfo(url: str, *, dbname: str | None = None) -> dict[str, Any]:
    """psycopg's parameters for ``url``; a multi-host URL's host and port lists
    and its ``target_session_attrs`` (the primary) are kept."""
    parsed = database_url.parse(url)
    info = {
        "host": parsed.get("HOST") or "127.0.0.1",
        "port": str(parsed.get("PORT") or 5432),
        "user": parsed.get("USER"),
        "password": parsed.get("PASSWORD") or None,
        "dbname": dbname or parsed.get("NAME"),
    }
    options = parsed.get("OPTIONS") or {}
    if "target_session_attrs" in options:
        info["target_session_attrs"] = options["target_session_attrs"]
    return info


def can_create_roles(url: str) -> bool:
    """Whether ``url``'s user is an administrator that may make the two roles."""
    with psycopg.connect(**_conninfo(url, dbname="postgres")) as conn:
        row = conn.execute(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles"
            " WHERE rolname = current_user"
        ).fetchone()
    return bool(row and row[0])


def ensure_roles(admin_url: str) -> None:
    """Create (or correct) the owner, the app role and the operator; idempotent.

    The owner may log in (migrations connect as it) and create databases (the test
    suite's); the app role and the operator may log in and nothing else. The
    discovery role cannot log in; it bypasses row-level security for the discovery
    functions it owns, and the owner is its member only so that a migration can hand
    them over (``ALTER FUNCTION … OWNER TO`` needs it). The app role is never its
    member.
    """
    with psycopg.connect(
        **_conninfo(admin_url, dbname="postgres"), autocommit=True
    ) as conn:
        # One at a time: concurrent ALTER ROLEs of one role fail ("tuple concurrently
        # updated"), e.g. the test suite's workers, each making its database.
        conn.execute("SELECT pg_advisory_lock(hashtext('portal.ensure_roles'))")
        for role, attributes in (
            (OWNER_ROLE, "LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOBYPASSRLS"),
            (APP_ROLE, "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS"),
            (OPERATOR_ROLE, "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS"),
            (
                DISCOVERY_ROLE,
                "NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE BYPASSRLS",
            ),
        ):
            exists = conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", [role]
            ).fetchone()
            if exists is None:
                # A parallel run may make it first.
                with contextlib.suppress(psycopg.errors.DuplicateObject):
                    conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
            conn.execute(
                sql.SQL("ALTER ROLE {} " + attributes).format(sql.Identifier(role))
            )
        conn.execute(
            sql.SQL("GRANT {} TO {}").format(
                sql.Identifier(DISCOVERY_ROLE), sql.Identifier(OWNER_ROLE)
            )
        )


def adopt_database(admin_url: str) -> None:
    """Give the database and everything in its ``public`` schema to the owner.

    For a database made before the two roles existed (an older ``var/pgdata``);
    a no-op once the owner owns it all. The discovery functions stay the discovery
    role's.
    """
    info = _conninfo(admin_url)
    with psycopg.connect(**info, autocommit=True) as conn:
        owner = sql.Identifier(OWNER_ROLE)
        conn.execute(
            sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                sql.Identifier(info["dbname"]), owner
            )
        )
        kinds = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW"}
        relations = conn.execute(
            """
            SELECT c.relname, c.relkind FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm')
              AND c.relowner <> %s::regrole
            """,
            [OWNER_ROLE],
        ).fetchall()
        for name, kind in relations:
            conn.execute(
                sql.SQL("ALTER {} {} OWNER TO {}").format(
                    sql.SQL(kinds[kind]), sql.Identifier(name), owner
                )
            )
        functions = conn.execute(
            """
            SELECT p.oid::regprocedure::text FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'public'
              AND p.proowner NOT IN (%s::regrole, %s::regrole)
            """,
            [OWNER_ROLE, DISCOVERY_ROLE],
        ).fetchall()
        for (signature,) in functions:
            conn.execute(
                sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(
                    sql.SQL(signature), owner
                )
            )


def _quoted(role: str) -> str:
    return '"' + role.replace('"', '""') + '"'


def grant_app_role(cursor: Any, *, test_clock: bool) -> None:
    """Apply ``APP_GRANTS`` (and the test clock, for the test suite) and
    ``OPERATOR_GRANTS`` on the owner's ``cursor`` (Django's or psycopg's)."""
    app = app_role()
    cursor.execute("SELECT current_user")
    (current,) = cursor.fetchone()
    if not app or app == current:
        return  # one role for everything: nothing to grant (not for production)
    statements = APP_GRANTS + (TEST_CLOCK_GRANT if test_clock else "")
    cursor.execute(statements.format(app=_quoted(app)))
    # The tenant_deletion migration needs the role, so after a migrate it exists.
    cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [OPERATOR_ROLE])
    if cursor.fetchone() is not None:
        cursor.execute(OPERATOR_GRANTS.format(app=_quoted(OPERATOR_ROLE)))


@contextmanager
def connected_as(alias: str, url: str) -> Iterator[BaseDatabaseWrapper]:
    """Reconnect ``alias`` as ``url``'s user for the block, then as before."""
    connection = connections[alias]
    parsed = database_url.parse(url)
    keys = ("USER", "PASSWORD")
    before = {key: connection.settings_dict.get(key) for key in keys}
    connection.close()
    connection.settings_dict.update({key: parsed.get(key) for key in keys})
    try:
        yield connection
    finally:
        connection.close()
        connection.settings_dict.update(before)


def use_role(alias: str, *, user: str, password: str | None = None) -> None:
    """From now on, connect ``alias`` as ``user`` (``up`` and the test suite)."""
    connection = connections[alias]
    connection.close()
    connection.settings_dict.update({"USER": user, "PASSWORD": password or ""})
