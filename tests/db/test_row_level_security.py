"""Row-level security: catalog audit, raw SQL across tenants, no scope carried over.

The tests' connection is the app role's (tests/conftest.py), which no policy exempts.
Each test works in the tenants it makes (``tenant_scope_of_the_test``); the tests
narrow that with ``scope.tenant_scope`` to play one tenant against another.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from rest_framework.test import APIClient

from portal import db_roles, scope
from portal import services as portal_services
from portal.models import AgentGrant, Role
from portal.scope_middleware import TenantScopeMiddleware
from tasks.jobs import run_operation_job
from tests.support.db import connect_as

# Tables with tenant_id allowed to lack row-level security: none. A new one must
# get the policy in its migration (or be listed here with the reason).
PENDING: frozenset[str] = frozenset()

CATALOG = """
SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
       EXISTS (
           SELECT 1 FROM pg_policy p
           WHERE p.polrelid = c.oid AND p.polcmd = '*' AND p.polpermissive
             AND p.polroles = '{0}'
             AND pg_get_expr(p.polqual, p.polrelid) LIKE '%%portal_tenant_scope()%%'
             AND pg_get_expr(p.polwithcheck, p.polrelid)
                 LIKE '%%portal_tenant_scope()%%'
       )
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id'
    AND NOT a.attisdropped
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY 1
"""

# Partitions (audit_event's months) are governed by their parent: a query through
# the parent is checked against the parent's privileges and policies alone, so the
# app role must hold nothing on a partition itself (no way around the parent).
PARTITION_PRIVILEGES = """
SELECT c.relname, p.privilege_type
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) p
WHERE n.nspname = 'public' AND c.relispartition AND p.grantee = %s::regrole
ORDER BY 1, 2
"""


def rls_violations(cursor: Any) -> list[str]:
    """Tables with ``tenant_id`` lacking RLS enabled, forced, and the scope policy
    (for every role and command), other than the declared pending ones."""
    cursor.execute(CATALOG)
    return [
        table
        for table, enabled, forced, policy in cursor.fetchall()
        if table not in PENDING and not (enabled and forced and policy)
    ]


def test_every_tenant_owned_table_has_forced_rls_and_the_scope_policy(db):
    with connection.cursor() as cursor:
        assert rls_violations(cursor) == []
        cursor.execute(CATALOG)
        covered = {row[0] for row in cursor.fetchall() if all(row[1:])}
    assert not covered & PENDING, "covered now: take it off PENDING"


def test_partitions_are_reached_through_their_parent_alone(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_class WHERE relispartition"
            " AND relnamespace = 'public'::regnamespace"
        )
        assert cursor.fetchone()[0] > 0  # audit_event's months exist
        cursor.execute(PARTITION_PRIVILEGES, [db_roles.app_role()])
        assert cursor.fetchall() == []


def test_a_new_partition_gets_no_privileges_of_its_own(db):
    with connect_as("owner") as owner, owner.cursor() as cursor:
        cursor.execute("SELECT audit_event_partition_create('2031-05-01')")
        assert cursor.fetchone() == ("audit_event_p203105",)
        cursor.execute(PARTITION_PRIVILEGES, [db_roles.app_role()])
        assert cursor.fetchall() == []
        owner.rollback()


def test_the_catalog_audit_fails_for_a_new_tenant_table(db):
    with connect_as("owner") as owner, owner.cursor() as cursor:
        cursor.execute("CREATE TABLE rls_probe_new (id int, tenant_id uuid)")
        assert rls_violations(cursor) == ["rls_probe_new"]
        owner.rollback()


def _grants(**filters: Any) -> int:
    return AgentGrant.objects.filter(**filters).count()


def test_raw_sql_in_tenant_a_cannot_read_or_write_tenant_b(
    tenant, other_tenant, make_agent
):
    a_agent, b_agent = make_agent(tenant=tenant), make_agent(tenant=other_tenant)
    b_rows = _grants(tenant=other_tenant)
    assert b_rows > 0
    with scope.tenant_scope([tenant.pk]), connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM portal_agentgrant WHERE tenant_id = %s",
            [other_tenant.pk],
        )
        assert cursor.fetchone() == (0,)
        cursor.execute(
            "UPDATE portal_agentgrant SET target = 'moved' WHERE tenant_id = %s",
            [other_tenant.pk],
        )
        assert cursor.rowcount == 0
        cursor.execute(
            "DELETE FROM portal_agentgrant WHERE tenant_id = %s", [other_tenant.pk]
        )
        assert cursor.rowcount == 0
        for statement, params in (
            (
                "INSERT INTO portal_agentgrant (id, tenant_id, agent_id, action,"
                " target, created_at) VALUES (gen_random_uuid(), %s, %s, 'x', '*',"
                " now())",
                [other_tenant.pk, b_agent.pk],
            ),
            (  # moving one's own row into B is a write into B too
                "UPDATE portal_agentgrant SET tenant_id = %s WHERE agent_id = %s",
                [other_tenant.pk, a_agent.pk],
            ),
        ):
            with pytest.raises(ProgrammingError) as caught, transaction.atomic():
                cursor.execute(statement, params)
            assert caught.value.__cause__.sqlstate == "42501"
        cursor.execute("SELECT count(*) FROM portal_agentgrant")
        assert cursor.fetchone() == (_grants(tenant=tenant),)
    assert _grants(tenant=other_tenant, target="*") == b_rows  # B untouched


def test_no_scope_no_rows(tenant, make_agent):
    make_agent(tenant=tenant)
    with scope.tenant_scope([]):
        assert AgentGrant.objects.count() == 0
    with scope.unit_of_work():
        assert scope.current() is None
        assert AgentGrant.objects.count() == 0


def _setting() -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('portal.tenant_ids', true)")
        return cursor.fetchone()[0] or ""


@pytest.mark.django_db(transaction=True)
def test_the_setting_is_transaction_local(tenant):
    with scope.tenant_scope([tenant.pk]):
        assert _setting() == str(tenant.pk)
    with scope.unit_of_work():
        # The same pooled connection, the next transaction: nothing carried over.
        assert _setting() == ""
        with connection.cursor() as cursor:  # nor outside a transaction
            cursor.execute("SELECT current_setting('portal.tenant_ids', true)")
            assert (cursor.fetchone()[0] or "") == ""


@pytest.mark.django_db(transaction=True)
def test_a_separate_app_connection_without_the_setting_sees_nothing(tenant, make_agent):
    make_agent(tenant=tenant)  # committed: the test is transactional
    with connect_as("app") as conn:
        assert conn.execute("SELECT count(*) FROM portal_agentgrant").fetchone() == (0,)
        conn.execute(
            "SELECT set_config('portal.tenant_ids', %s, true)", [str(tenant.pk)]
        )
        assert conn.execute("SELECT count(*) FROM portal_agentgrant").fetchone()[0] > 0
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM portal_agentgrant").fetchone() == (0,)


@pytest.mark.django_db(transaction=True)
def test_a_request_leaves_no_scope_behind(tenant, other_tenant, make_agent):
    agent = make_agent(tenant=tenant)
    secret = portal_services.agent_key_issue(agent=agent).secret
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    with scope.unit_of_work():
        assert http.get("/api/v1/tasks").status_code == 200
        assert scope.current() is None
        assert _setting() == ""
        # A request that fails leaves none either.
        http.credentials(HTTP_AUTHORIZATION="Bearer nope.nope")
        assert http.get("/api/v1/tasks").status_code == 401
        assert scope.current() is None
        assert _setting() == ""


@pytest.mark.django_db(transaction=True)
def test_a_job_leaves_no_scope_behind_even_when_it_fails(tenant):
    with scope.unit_of_work():
        with pytest.raises(Exception):  # noqa: B017 (any failure will do)
            run_operation_job(
                tenant_id=str(tenant.pk), operation_id=str(tenant.pk)
            )  # no such operation
        assert scope.current() is None
        assert _setting() == ""


def test_a_person_sees_the_rows_of_their_tenants_only(
    tenant, other_tenant, make_agent, django_user_model
):
    make_agent(tenant=tenant)
    make_agent(tenant=other_tenant)
    person = django_user_model.objects.create_user("member-of-a", is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=person, role=Role.REVIEWER)

    def view(request: HttpRequest) -> HttpResponse:
        # An unscoped queryset: row-level security is the wall here.
        tenants = set(AgentGrant.objects.values_list("tenant_id", flat=True))
        return HttpResponse(",".join(sorted(str(t) for t in tenants)))

    request = RequestFactory().get("/admin/")
    request.user = person
    with scope.unit_of_work():
        response = TenantScopeMiddleware(view)(request)
        assert response.content.decode() == str(tenant.pk)
        assert scope.current() is None


def test_the_app_role_is_bound_by_the_policies(db):
    """Not the owner, no BYPASSRLS: nothing exempts the tests' connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolbypassrls, rolsuper FROM pg_roles WHERE rolname = current_user"
        )
        assert cursor.fetchone() == (False, False)
        cursor.execute("SELECT current_user")
        assert cursor.fetchone() == (db_roles.APP_ROLE,)


def test_the_owner_is_bound_too(db):
    """FORCE: the owner's definer functions see only their caller's tenants."""
    with connect_as("owner") as owner:
        assert owner.execute("SELECT count(*) FROM portal_agentgrant").fetchone() == (
            0,
        )


# --- Every covered table, and the one way across tenants -----------------------------

# The twelve tables tasks migration 0015 covered (audit_event through its parent).
NEWLY_COVERED = (
    "audit_checkpoint",
    "audit_event",
    "audit_outbox",
    "audit_retentionanchor",
    "audit_retentionpolicy",
    "audit_retentionpurge",
    "portal_agent",
    "portal_agentkey",
    "portal_idempotentrequest",
    "portal_membership",
    "tasks_operation",
    "tasks_task",
)


def _rows_in_every_table(tenant: Any, make_agent: Any, make_operation: Any, user: Any):
    """One tenant's rows in each of the twelve tables (committed: transactional)."""
    import datetime as dt
    import uuid

    from audit import checkpoints
    from audit import services as audit_services
    from audit.models import EventCode, RetentionPolicy
    from portal.actors import Actor
    from portal.models import IdempotentRequest
    from tasks.models import Task, TaskState

    with scope.tenant_scope([tenant.pk]):
        agent = make_agent(tenant=tenant)
        portal_services.agent_key_issue(agent=agent)
        portal_services.membership_grant(tenant=tenant, user=user, role=Role.REVIEWER)
        task = Task.objects.create(
            tenant=tenant,
            state=TaskState.PENDING,
            client_task_id=f"rls-{uuid.uuid4()}",
            registration_hash="0" * 64,
            workflow_key="customer-issue",
            workflow_version="1",
            object_type="customer_issue",
            object_id=f"issue-{uuid.uuid4()}",
            object_version="1",
        )
        operation = make_operation(task=task)
        with transaction.atomic():
            event_id = audit_services.event_append(
                tenant_id=tenant.pk,
                code=EventCode.TASK_REGISTERED,
                actor=Actor.system("rls-test"),
                task_id=operation.task_id,
            )
        checkpoints.tenant_checkpoint(
            tenant_id=tenant.pk, key=checkpoints.signing_key()
        )
        RetentionPolicy.objects.create(tenant=tenant, event_months=12, payload_days=30)
        IdempotentRequest.objects.create(
            tenant=tenant,
            agent=agent,
            key=f"rls-{uuid.uuid4()}",
            fingerprint="0" * 64,
            state="completed",
            locked_until=dt.datetime.now(dt.UTC),
            expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
        )
    # Retention's records only the owner's purge writes: a superuser stands in.
    purge_id = uuid.uuid4()
    with connect_as("admin") as admin:
        admin.execute(
            "INSERT INTO audit_retentionpurge (id, tenant_id, before_id, events,"
            " purged_at) VALUES (%s, %s, %s, 0, now())",
            [purge_id, tenant.pk, event_id],
        )
        admin.execute(
            "INSERT INTO audit_retentionanchor (tenant_id, purge_id, task_id, seq,"
            " event_id, hash) VALUES (%s, %s, %s, 0, %s, %s)",
            [tenant.pk, purge_id, operation.task_id, event_id, "0" * 64],
        )
        admin.commit()


def _count_as_admin(table: str, tenant_id: Any) -> int:
    with connect_as("admin") as admin:
        row = admin.execute(
            f"SELECT count(*) FROM {table} WHERE tenant_id = %s", [tenant_id]
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db(transaction=True)
def test_raw_sql_in_tenant_a_cannot_read_or_write_b_in_any_covered_table(
    tenant, other_tenant, make_agent, make_operation, django_user_model
):
    person = django_user_model.objects.create_user("rls-member")
    for owner in (tenant, other_tenant):
        _rows_in_every_table(owner, make_agent, make_operation, person)
    before = {t: _count_as_admin(t, other_tenant.pk) for t in NEWLY_COVERED}
    assert all(before.values()), before  # B has rows in each table
    refused: dict[str, str] = {}
    with scope.tenant_scope([tenant.pk]), connection.cursor() as cursor:
        for table in NEWLY_COVERED:
            cursor.execute(
                f"SELECT count(*) FROM {table} WHERE tenant_id = %s", [other_tenant.pk]
            )
            assert cursor.fetchone() == (0,), table
            cursor.execute(f"SELECT count(*) FROM {table} WHERE tenant_id = %s",
                           [tenant.pk])  # fmt: skip
            assert cursor.fetchone()[0] > 0, table  # A's own rows are there
            cursor.execute(
                "SELECT has_table_privilege(%s, 'UPDATE'),"
                " has_table_privilege(%s, 'DELETE')",
                [table, table],
            )
            may_update, may_delete = cursor.fetchone()
            if may_update:
                cursor.execute(
                    f"UPDATE {table} SET tenant_id = tenant_id WHERE tenant_id = %s",
                    [other_tenant.pk],
                )
                assert cursor.rowcount == 0, table
            if may_delete:
                cursor.execute(
                    f"DELETE FROM {table} WHERE tenant_id = %s", [other_tenant.pk]
                )
                assert cursor.rowcount == 0, table
            # A copy of an own row, into B: the policy's WITH CHECK refuses it.
            # Generated columns (audit_outbox.task_id) take no value: nobody may
            # write one, so the copy names the others.
            cursor.execute(
                "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum)"
                " FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped AND attgenerated = ''",
                [table],
            )
            (columns,) = cursor.fetchone()
            with pytest.raises(ProgrammingError) as caught, transaction.atomic():
                cursor.execute(
                    f"INSERT INTO {table} ({columns}) SELECT {columns} FROM ("
                    f"SELECT (jsonb_populate_record(NULL::{table}, to_jsonb(x)"
                    f" || jsonb_build_object('tenant_id', %s::text))).*"
                    f" FROM {table} x WHERE x.tenant_id = %s LIMIT 1) AS copy",
                    [other_tenant.pk, tenant.pk],
                )
            refused[f"{table} INSERT"] = str(caught.value)
            if may_update:  # moving an own row into B (a row trigger may say no
                # first: BEFORE ROW triggers run before the policy's check)
                with (
                    pytest.raises((ProgrammingError, IntegrityError)),
                    transaction.atomic(),
                ):
                    cursor.execute(
                        f"UPDATE {table} SET tenant_id = %s WHERE tenant_id = %s",
                        [other_tenant.pk, tenant.pk],
                    )
    # Refused by the policy, not merely for want of a privilege.
    for write, error in refused.items():
        no_insert_privilege = write.split()[0] in (
            "audit_retentionpurge",
            "audit_retentionanchor",
        )
        assert ("row-level security" in error) != no_insert_privilege, (write, error)
    assert {t: _count_as_admin(t, other_tenant.pk) for t in NEWLY_COVERED} == before


def test_the_partitions_carry_the_parents_policy(db):
    """The owner's retention functions reach a partition directly: it is bound by
    the same policy as the parent, new months included."""
    partitions = """
        SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
               EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid
                       AND pg_get_expr(p.polqual, p.polrelid)
                           LIKE '%%portal_tenant_scope()%%')
        FROM pg_class c WHERE c.relispartition AND c.relkind = 'r'
          AND c.relnamespace = 'public'::regnamespace
    """
    with connect_as("owner") as owner, owner.cursor() as cursor:
        cursor.execute("SELECT audit_event_partition_create('2031-07-01')")
        cursor.execute(partitions)
        rows = cursor.fetchall()
        assert "audit_event_p203107" in {row[0] for row in rows}
        assert [row for row in rows if not all(row[1:])] == []
        owner.rollback()


DISCOVERY_CATALOG = """
SELECT p.oid::regprocedure::text, p.prosecdef, p.proretset,
       p.prorettype::regtype::text, p.provolatile,
       has_function_privilege(%(app)s, p.oid, 'EXECUTE'),
       has_function_privilege('public', p.oid, 'EXECUTE'),
       array_to_string(p.proconfig, ',')
FROM pg_proc p
WHERE p.proowner = %(role)s::regrole
ORDER BY 1
"""


def test_the_discovery_functions_are_pinned(db):
    """The one way across tenants: these functions, owned by the discovery role,
    definer, returning only tenant ids, executable by the app role alone."""
    with connection.cursor() as cursor:
        cursor.execute(
            DISCOVERY_CATALOG,
            {"app": db_roles.APP_ROLE, "role": db_roles.DISCOVERY_ROLE},
        )
        rows = cursor.fetchall()
    assert [row[0] for row in rows] == sorted(db_roles.DISCOVERY_FUNCTIONS)
    for row in rows:
        assert row[1:] == (
            True,  # SECURITY DEFINER
            True,  # a set of …
            "uuid",  # … tenant ids, nothing else
            "s",  # STABLE: reads, never writes
            True,  # the app role executes it
            False,  # PUBLIC does not
            "search_path=pg_catalog, public, pg_temp",
        ), row[0]


def test_the_discovery_role_can_do_nothing_but_own_them(db):
    role = db_roles.DISCOVERY_ROLE
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolcanlogin, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb"
            " FROM pg_roles WHERE rolname = %s",
            [role],
        )
        assert cursor.fetchone() == (False, False, True, False, False)
        # Nobody uses it but through its functions: the app role is no member.
        cursor.execute(
            "SELECT pg_has_role(%s, %s, 'MEMBER')", [db_roles.APP_ROLE, role]
        )
        assert cursor.fetchone() == (False,)
        # It owns no table, no schema, and holds no table-wide privilege: only the
        # columns its functions filter on (tasks migration 0015).
        cursor.execute(
            """
            SELECT c.relname FROM pg_class c WHERE c.relowner = %(r)s::regrole
            UNION ALL
            SELECT n.nspname FROM pg_namespace n WHERE n.nspowner = %(r)s::regrole
            UNION ALL
            SELECT c.relname || ' ' || p.privilege_type FROM pg_class c
            CROSS JOIN LATERAL aclexplode(c.relacl) p
            WHERE p.grantee = %(r)s::regrole
            UNION ALL
            SELECT 'schema CREATE' WHERE has_schema_privilege(%(r)s, 'public', 'CREATE')
            """,
            {"r": role},
        )
        assert cursor.fetchall() == []
        cursor.execute(
            "SELECT DISTINCT c.relname FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid"
            " CROSS JOIN LATERAL aclexplode(a.attacl) p"
            " WHERE p.grantee = %s::regrole ORDER BY 1",
            [role],
        )
        assert [row[0] for row in cursor.fetchall()] == [
            "audit_outbox",
            "audit_treehead",
            "portal_agentkey",
            "portal_idempotentrequest",
            "portal_invitation",
            "portal_membership",
            "portal_test_clock",
            "routing_assignment",
            "routing_notification",
            "tasks_approval",
            "tasks_operation",
            "tasks_task",
            "tenant_deletion_tombstone",
        ]
        # The column grants hold no payload, input or secret column.
        cursor.execute(
            "SELECT c.relname, a.attname FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid"
            " CROSS JOIN LATERAL aclexplode(a.attacl) p"
            " WHERE p.grantee = %s::regrole AND a.attname IN"
            " ('payload', 'input', 'result', 'response_body', 'call_fields',"
            " 'name', 'last_error')",
            [role],
        )
        assert cursor.fetchall() == []


def test_discovery_reveals_tenant_ids_only_and_refuses_misuse(
    tenant, other_tenant, make_task, make_agent, django_user_model
):
    from portal.selectors import agent_key_hash

    make_task(tenant=tenant, state="running", leased=True, lease_seconds=-1)
    make_task(tenant=other_tenant, state="running", leased=True, lease_seconds=60)
    agent = make_agent(tenant=other_tenant)
    secret = portal_services.agent_key_issue(agent=agent).secret
    prefix = secret.partition(".")[0]
    person = django_user_model.objects.create_user("rls-discovery")
    portal_services.membership_grant(tenant=tenant, user=person, role=Role.REVIEWER)
    with scope.unit_of_work():  # no scope at all: the functions still answer
        assert scope.discover("tasks_tenants_with_lapsed_leases") == [str(tenant.pk)]
        # A key: both prefix and hash must match; a prefix alone finds nothing.
        assert scope.discover(
            "portal_agent_key_tenant", prefix, agent_key_hash(secret)
        ) == [str(other_tenant.pk)]
        assert scope.discover("portal_agent_key_tenant", prefix, "0" * 64) == []
        assert scope.discover("portal_agent_key_tenant", None, None) == []
        assert scope.discover("portal_person_tenants", person.pk) == [str(tenant.pk)]
        assert scope.discover("portal_person_tenants", 0) == []
        # Only the listed functions are called, by name.
        with pytest.raises(ValueError):
            scope.discover("tenant_deletion_purge")
    # The app role cannot reach round them: not a member of the role, no SET ROLE.
    with (
        pytest.raises(ProgrammingError),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"SET LOCAL ROLE {db_roles.DISCOVERY_ROLE}")
    # Nobody else may execute them.
    with connect_as("admin") as admin:
        admin.execute("CREATE ROLE rls_probe_other NOLOGIN")
        try:
            admin.execute("SET LOCAL ROLE rls_probe_other")
            with pytest.raises(Exception) as caught:
                admin.execute("SELECT * FROM tasks_tenants_with_lapsed_leases()")
            assert caught.value.sqlstate == "42501"
        finally:
            admin.rollback()


def test_retention_refuses_a_scope_without_every_tenant(tenant, other_tenant):
    from audit import retention

    with scope.tenant_scope([tenant.pk]), pytest.raises(ProgrammingError) as caught:
        retention.event_partitions_drop()
    assert "every tenant in scope" in str(caught.value)
    with scope.every_tenant():
        assert retention.event_partitions_drop() == []


def test_the_tenant_purge_refuses_a_tenant_outside_the_scope(tenant, other_tenant):
    """As the operator, the one role that may run it (docs/tenant-deletion.md)."""
    with connect_as("operator") as operator:
        operator.execute(
            "SELECT set_config('portal.tenant_ids', %s, true)", [str(tenant.pk)]
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            operator.execute(
                "SELECT * FROM tenant_deletion_purge(%s)", [other_tenant.pk]
            )
    assert "not in scope" in str(caught.value)


def test_the_key_lookup_counts_a_key_that_authenticates_and_keeps_the_callers_scope(
    tenant, other_tenant, make_agent
):
    """``portal_agent_key_authenticate``: discovery, the key read in its own tenant's
    scope, the request counted, in one statement; the caller's scope comes back."""
    from portal.models import AgentRequestWindow
    from portal.selectors import agent_key_authenticate

    # Given a live and a revoked key of tenant B
    live_agent, revoked_agent = (
        make_agent(tenant=other_tenant),
        make_agent(tenant=other_tenant),
    )
    live = portal_services.agent_key_issue(agent=live_agent).secret
    revoked = portal_services.agent_key_issue(agent=revoked_agent)
    portal_services.agent_key_revoke(key=revoked.key)
    # When they are looked up inside a transaction scoped to tenant A
    with scope.tenant_scope([tenant.pk]), connection.cursor() as cursor:
        first = agent_key_authenticate(secret=live, count_in_window_s=60)
        second = agent_key_authenticate(secret=live, count_in_window_s=60)
        uncounted = agent_key_authenticate(secret=live)
        refused = agent_key_authenticate(secret=revoked.secret, count_in_window_s=60)
        cursor.execute("SELECT current_setting('portal.tenant_ids', true)")
        setting = cursor.fetchone()[0]
    # Then the live key is found with its agent and counted once per counted lookup
    assert first is not None and first.key.agent.pk == live_agent.pk
    assert first.key.agent.tenant.pk == other_tenant.pk
    assert first.window is not None and first.window.requests == 1
    assert 0 < first.window.left_s <= 60
    assert second is not None and second.window is not None
    assert second.window.requests == 2
    assert uncounted is not None and uncounted.window is None
    # the revoked one is told apart for its holder and not counted
    assert refused is not None and refused.status == "revoked"
    assert refused.window is None
    # and tenant A's scope is what it was, not B's
    assert setting == str(tenant.pk)
    with scope.tenant_scope([other_tenant.pk]):
        counted = dict(AgentRequestWindow.objects.values_list("agent_id", "requests"))
    assert counted == {live_agent.pk: 2}
