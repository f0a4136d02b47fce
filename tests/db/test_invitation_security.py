"""Invitations under row-level security, by raw SQL as the app role, and the one
narrow way in before a tenant: ``portal_invitation_tenant`` (docs/database-roles.md).

Also two acceptances of one link on two real connections at once: one membership.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import ProgrammingError, connection, transaction

from audit.models import Event, EventCode
from console import invitations
from console.exceptions import InvitationUsed
from portal import scope
from portal import services as portal_services
from portal.models import Invitation, Membership, Role, Tenant
from tests.support.concurrency import run_in_threads
from tests.support.db import conninfo

PASSWORD = "pw-invitation-db-1"


def _invite(tenant: Tenant, email: str) -> tuple[Invitation, str]:
    admin = User.objects.create_user(
        f"admin-{tenant.slug}", password=PASSWORD, is_staff=True
    )
    portal_services.membership_grant(tenant=tenant, user=admin, role=Role.ADMIN)
    with scope.tenant_scope([tenant.pk]):
        issued = invitations.invitation_create(
            tenant=tenant, by=admin, email=email, role=Role.SUPPORT
        )
    return issued.invitation, issued.token


@pytest.mark.django_db(transaction=True)
def test_raw_sql_in_tenant_a_cannot_read_or_write_bs_invitations(
    tenant: Tenant, other_tenant: Tenant
):
    mine, _ = _invite(tenant, "a@example.com")
    theirs, _ = _invite(other_tenant, "b@example.com")
    with scope.tenant_scope([tenant.pk]), connection.cursor() as cursor:
        cursor.execute("SELECT id FROM portal_invitation ORDER BY id")
        assert [row[0] for row in cursor.fetchall()] == [mine.pk]
        cursor.execute(
            "SELECT count(*) FROM portal_invitation WHERE token_hash = %s",
            [theirs.token_hash],
        )
        assert cursor.fetchone() == (0,)
        cursor.execute(
            "UPDATE portal_invitation SET accepted_at = now() WHERE id = %s",
            [theirs.pk],
        )
        assert cursor.rowcount == 0
        cursor.execute("DELETE FROM portal_invitation WHERE id = %s", [theirs.pk])
        assert cursor.rowcount == 0
        # Writing a row into B, or moving A's there: the policy's WITH CHECK.
        for statement, params in [
            (
                "INSERT INTO portal_invitation (id, tenant_id, email, role,"
                " token_hash, invited_by_id, created_at, expires_at) SELECT"
                " gen_random_uuid(), %s, 'x@example.com', role, md5(random()::text),"
                " invited_by_id, now(), expires_at FROM portal_invitation"
                " WHERE id = %s",
                [other_tenant.pk, mine.pk],
            ),
            (
                "UPDATE portal_invitation SET tenant_id = %s WHERE id = %s",
                [other_tenant.pk, mine.pk],
            ),
        ]:
            with pytest.raises(ProgrammingError) as caught, transaction.atomic():
                cursor.execute(statement, params)
            assert "row-level security" in str(caught.value)
    # No scope, no rows; and a separate app-role connection sees none either.
    with scope.unit_of_work(), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM portal_invitation")
        assert cursor.fetchone() == (0,)
    with psycopg.connect(**conninfo(user=connection.settings_dict["USER"])) as raw:
        assert raw.execute("SELECT count(*) FROM portal_invitation").fetchone() == (0,)
    with scope.tenant_scope([other_tenant.pk]):
        assert Invitation.objects.get(pk=theirs.pk).accepted_at is None


@pytest.mark.django_db
def test_the_discovery_function_names_the_tenant_for_the_exact_hash_only(
    tenant: Tenant, other_tenant: Tenant
):
    _, token = _invite(other_tenant, "b@example.com")
    digest = hashlib.sha256(token.encode()).hexdigest()
    with scope.unit_of_work():  # before any tenant, as the link's page runs
        assert scope.discover("portal_invitation_tenant", digest) == [
            str(other_tenant.pk)
        ]
        assert scope.discover("portal_invitation_tenant", token) == []  # not hashed
        other_digit = "1" if digest.endswith("0") else "0"  # one digit off, never the same
        assert scope.discover("portal_invitation_tenant", digest[:-1] + other_digit) == []
        assert scope.discover("portal_invitation_tenant", None) == []
        # It tells the tenant id and nothing else: the row stays out of reach.
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM portal_invitation_tenant(%s)", [digest])
            assert [d.name for d in cursor.description] == ["portal_invitation_tenant"]
            cursor.execute("SELECT count(*) FROM portal_invitation")
            assert cursor.fetchone() == (0,)


@pytest.mark.django_db(transaction=True)
def test_two_acceptances_of_one_link_at_once_make_one_membership(tenant: Tenant):
    _, token = _invite(tenant, "c@example.com")
    people = [
        User.objects.create_user(f"racer-{n}", password=PASSWORD, is_staff=True)
        for n in range(2)
    ]
    barrier = threading.Barrier(2, timeout=10)

    def accept(person: User) -> Any:
        def run() -> Any:
            barrier.wait()
            return invitations.invitation_accept(token=token, user=person)

        return run

    outcomes = run_in_threads(*(accept(p) for p in people))
    assert sum(isinstance(o, InvitationUsed) for o in outcomes) == 1, outcomes
    winners = [o for o in outcomes if isinstance(o, invitations.Accepted)]
    assert len(winners) == 1
    with scope.tenant_scope([tenant.pk]):
        members = Membership.objects.filter(tenant=tenant, user__in=people)
        assert list(members.values_list("user_id", flat=True)) == [winners[0].user.pk]
        assert (
            Event.objects.filter(
                tenant=tenant, code=EventCode.INVITATION_ACCEPTED
            ).count()
            == 1
        )
