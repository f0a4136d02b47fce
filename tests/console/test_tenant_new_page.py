"""The operator's new-tenant page (``/admin/tenants/new/``, console/tenant_page.py):
a tenant, its ``tenant.created`` event and an invitation of its first administrator
in one transaction; clear form errors; the page and the service for the operator
alone (docs/portal.md, "A new tenant")."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from audit.models import EventCode
from console import tenants
from portal import scope
from portal.exceptions import PermissionDenied, ValidationFailed
from portal.models import Invitation, Role, Tenant
from tests.console.conftest import PERSONAS, Cast
from tests.support.concurrency import run_in_threads
from tests.support.smtp import Inbox, smtp  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/tenants/new/"
FORM = {
    "slug": "acme",
    "name": "Acme Ltd",
    "events_on_delete": "keep",
    "admin_email": "Ada@Acme.example",
}


def _counts() -> tuple[int, ...]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM portal_tenant),"
            " (SELECT count(*) FROM portal_invitation),"
            " (SELECT count(*) FROM audit_event),"
            " (SELECT count(*) FROM auth_user)"
        )
        return tuple(cursor.fetchone())


@pytest.fixture
def operator(db: None) -> User:
    return User.objects.create_superuser("olive", "olive@example.com", "pw-op-1234")


def test_the_operator_makes_a_tenant_and_its_administrator_is_invited(
    client: Client,
    operator: User,
    smtp: Inbox,  # noqa: F811
    settings: Any,
):
    settings.PORTAL_PUBLIC_URL = "http://portal.test"
    client.force_login(operator)
    # given the form
    page = client.get(URL)
    assert page.status_code == 200
    assert b'name="admin_email"' in page.content

    # when the operator sends it
    response = client.post(URL, FORM)

    # then the tenant is made and the operator lands on its page, told what was done
    tenant = Tenant.objects.get(slug="acme")
    scope.include(tenant.pk)  # the request made it: the test reads it too
    assert (tenant.name, tenant.events_on_delete) == ("Acme Ltd", "keep")
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "admin:portal_tenant_change", args=[tenant.pk]
    )
    told = client.get(response["Location"]).content.decode()
    assert "Tenant &#x27;acme&#x27; (Acme Ltd) is made" in told
    assert "e-mailed to ada@acme.example" in told
    # and the administrator's invitation is stored, by the operator, for the role
    invitation = Invitation.objects.get(tenant=tenant)
    assert (invitation.email, invitation.role, invitation.invited_by_id) == (
        "ada@acme.example", Role.ADMIN, operator.pk,
    )  # fmt: skip
    # and no account is made before she accepts
    assert not User.objects.filter(email__iexact="ada@acme.example").exists()
    # and the new tenant's trail starts with tenant.created by the operator, then
    # the invitation (raw SQL: what is stored)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT code, actor_type, actor_id, payload FROM audit_event"
            " WHERE tenant_id = %s ORDER BY chain_seq",
            [tenant.pk],
        )
        trail = cursor.fetchall()
    assert [row[:3] for row in trail] == [
        (EventCode.TENANT_CREATED, "user", str(operator.pk)),
        (EventCode.INVITATION_SENT, "user", str(operator.pk)),
    ]
    assert json.loads(trail[0][3]) == {
        "slug": "acme", "name": "Acme Ltd", "events_on_delete": "keep",
        "first_admin": "invitation",
    }  # fmt: skip
    # and the e-mail went to her, with the link
    assert len(smtp.messages) == 1
    recipients, message, _ = smtp.messages[0]
    assert recipients == ["ada@acme.example"]
    assert message["Subject"] == "Invitation to Acme Ltd"
    body = bytes(message.get_payload(decode=True)).decode()
    assert "http://portal.test/invite/" in body and "Tenant administrator" in body


@pytest.mark.parametrize(
    ("change", "field", "error"),
    [
        ({"slug": "taken"}, "slug", "A tenant with the slug &#x27;taken&#x27; exists."),
        ({"name": "  TAKEN co "}, "name", "A tenant named &#x27;TAKEN co&#x27; exists"),
        ({"slug": "not a slug!"}, "slug", "Enter a valid “slug”"),
        ({"slug": "a" * 64}, "slug", "at most 63 characters"),
        ({"name": " "}, "name", "This field is required."),
        ({"admin_email": "ada"}, "admin_email", "Enter a valid email address."),
        ({"events_on_delete": "shred"}, "events_on_delete", "Select a valid choice."),
    ],
)
def test_a_refused_form_says_why_on_its_field_and_writes_nothing(
    client: Client, operator: User, change: Any, field: str, error: str
):
    Tenant.objects.create(slug="taken", name="Taken Co")
    client.force_login(operator)
    before = _counts()

    response = client.post(URL, {**FORM, **change})

    assert response.status_code == 400
    form = response.context["form"]
    assert list(form.errors) == [field]
    assert error in response.content.decode()
    assert _counts() == before


@pytest.mark.parametrize("persona", PERSONAS)
def test_nobody_but_the_operator_gets_the_page(cast: Cast, persona: str):
    # given a tenant's reviewer, support, admin, another tenant's admin, or staff
    # of no tenant
    client = cast.client(persona)
    before = _counts()
    # then the page is refused, and so is a POST, and nothing is written
    assert client.get(URL).status_code == 403
    assert client.post(URL, FORM).status_code == 403
    assert _counts() == before
    # and the tenant list's "Add" offers them nothing either
    add = client.get(reverse("admin:portal_tenant_add"))
    assert add.status_code == 403


def test_the_service_refuses_anyone_but_the_operator(cast: Cast):
    # the second wall: the business function checks the operator itself
    with pytest.raises(PermissionDenied):
        tenants.tenant_invite_admin(
            by=cast.people["admin_a"].user, slug="acme", name="Acme",
            email="ada@acme.example",
        )  # fmt: skip
    assert not Tenant.objects.filter(slug="acme").exists()


def test_the_tenant_lists_add_button_leads_to_the_page(client: Client, operator: User):
    client.force_login(operator)
    response = client.get(reverse("admin:portal_tenant_add"))
    assert (response.status_code, response["Location"]) == (302, URL)
    assert b'id="to-tenant-new"' in client.get("/admin/").content


def test_a_mail_server_that_refuses_leaves_the_tenant_and_the_invitation(
    client: Client, operator: User, settings: Any
):
    from tests.support.net import free_port

    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", free_port()  # nobody
    client.force_login(operator)

    response = client.post(URL, FORM, follow=True)

    assert response.status_code == 200
    said = response.content.decode()
    assert "is made and the invitation is stored, but its e-mail could not" in said
    tenant = Tenant.objects.get(slug="acme")
    scope.include(tenant.pk)
    assert Invitation.objects.filter(tenant=tenant, email="ada@acme.example").exists()


def test_two_operators_asking_for_one_slug_get_one_tenant_and_one_refusal(
    operator: User,
):
    other = User.objects.create_superuser("oscar", "oscar@example.com", "pw-op-5678")
    barrier = threading.Barrier(2)

    def make(by: User, name: str) -> Any:
        barrier.wait()
        return tenants.tenant_invite_admin(
            by=by, slug="acme", name=name, email=f"{by.username}@acme.example"
        )

    outcomes = run_in_threads(
        lambda: make(operator, "Acme One"), lambda: make(other, "Acme Two")
    )

    made = [o for o in outcomes if isinstance(o, tenants.InvitedAdmin)]
    refused = [o for o in outcomes if isinstance(o, ValidationFailed)]
    assert (len(made), len(refused)) == (1, 1), outcomes
    assert refused[0].context["field"] == "slug"
    scope.include(made[0].tenant.pk)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM portal_tenant WHERE slug = 'acme'")
        assert cursor.fetchone()[0] == 1
        cursor.execute("SELECT count(*) FROM audit_event WHERE code = 'tenant.created'")
        assert cursor.fetchone()[0] == 1
