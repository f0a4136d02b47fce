"""Row-level security: catalog audit, raw SQL across tenants, no scope carried over.

The tests' connection is the app role's (tests/conftest.py), which no policy exempts.
Each test works in the tenants it makes (``tenant_scope_of_the_test``); the tests
narrow that with ``scope.tenant_scope`` to play one tenant against another.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import ProgrammingError, connection, transaction
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from rest_framework.test import APIClient

from portal import db_roles, scope
from portal import services as portal_services
from portal.models import AgentGrant, Role
from portal.scope_middleware import TenantScopeMiddleware
from tasks.jobs import run_operation_job
from tests.support.db import connect_as

# Tables with tenant_id that wait for the cross-tenant mechanism (docs/database-
# roles.md, "Still to do"): work spanning tenants or log-in reads them across tenants.
# Retention's three (docs/retention.md) are read across tenants by its cleanup jobs
# and by the owner's definer functions (the global horizon over every tenant's
# policy, the partition drop over every tenant's purge records), which a forced
# policy would blind.
PENDING = frozenset(
    {
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
    }
)

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
