"""Inviting a member by e-mail (console/invitations.py, docs/portal.md).

A real SMTP server (aiosmtpd on 127.0.0.1) receives the invitation; the link taken
from the received message is opened by another client, as the invited person would.
Bad links answer 404 or 410 and write nothing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import HttpRequest
from django.test import Client

from audit.models import Event, EventCode
from console import invitations
from portal import services as portal_services
from portal.exceptions import TenantNotVisible
from portal.models import Invitation, Membership, Role, Tenant
from tests.support.db import db_clock_offset
from tests.support.smtp import Inbox, smtp  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db

PASSWORD = "pw-console-tests-1"
NEW_PASSWORD = "invited-Sunflower-42"
ADD = "/admin/portal/invitation/add/"
LINK = re.compile(r"http://\S+/invite/(\S+)")


def _person(username: str, tenant: Tenant | None = None, role: str = "") -> User:
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    if tenant is not None:
        portal_services.membership_grant(tenant=tenant, user=user, role=Role(role))
    return user


def _client(user: User | None = None) -> Client:
    client = Client()
    if user is not None:
        assert client.login(
            request=HttpRequest(), username=user.username, password=PASSWORD
        )
    return client


def _invite(client: Client, tenant: Tenant, email: str, role: str = "support") -> Any:
    return client.post(ADD, {"tenant": str(tenant.pk), "email": email, "role": role})


def _token(inbox: Inbox, index: int = -1) -> str:
    _, message, _ = inbox.messages[index]
    body = bytes(message.get_payload(decode=True)).decode()
    found = LINK.search(body)
    assert found, body
    return found.group(1)


def _written(tenant: Tenant) -> tuple[int, int, int, int]:
    """Everything acceptance writes: memberships, accounts, events, open invites."""
    return (
        Membership.objects.filter(tenant=tenant).count(),
        User.objects.count(),
        Event.objects.filter(tenant=tenant).count(),
        Invitation.objects.filter(tenant=tenant, accepted_at__isnull=True).count(),
    )


@pytest.fixture
def ada(tenant: Tenant) -> User:
    return _person("ada", tenant, Role.ADMIN)


@pytest.fixture
def invited(ada: User, tenant: Tenant, smtp: Inbox) -> str:  # noqa: F811
    """Ada invites carol@example.com as support; the received link's token."""
    response = _invite(_client(ada), tenant, "Carol@Example.com")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert len(smtp.messages) == 1
    return _token(smtp)


def test_an_admin_invites_and_the_link_makes_an_account(
    ada: User,
    tenant: Tenant,
    smtp: Inbox,  # noqa: F811
):
    # Given Ada, the tenant's admin, invites an address on the add page
    response = _invite(_client(ada), tenant, "Carol@Example.com")
    assert response.status_code == 302, re.findall(
        r'class="errorlist[^"]*"[^>]*>(.*?)</ul>', response.content.decode(), re.S
    )
    # Then one e-mail reached the SMTP server, to the address, with the link
    assert len(smtp.messages) == 1
    recipients, message, _ = smtp.messages[0]
    assert recipients == ["carol@example.com"]
    assert tenant.name in message["Subject"]
    token = _token(smtp)
    # And only the token's hash is stored, with the inviter and the role
    invitation = Invitation.objects.get(tenant=tenant)
    assert invitation.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(Invitation.objects.filter(pk=invitation.pk).values())
    assert (invitation.email, invitation.role) == ("carol@example.com", "support")
    assert invitation.invited_by_id == ada.pk and invitation.accepted_at is None
    sent = Event.objects.get(tenant=tenant, code=EventCode.INVITATION_SENT)
    assert (sent.actor_type, sent.actor_id) == ("user", str(ada.pk))
    assert sent.payload["invitation_id"] == str(invitation.pk)
    assert token not in str(sent.payload)

    # When Carol, signed out, opens the link
    carol_client = Client()
    page = carol_client.get(f"/invite/{token}")
    assert page.status_code == 200
    assert tenant.name in page.content.decode()
    assert page["Referrer-Policy"] == "same-origin"  # the token stays on the site
    # And chooses a username and password
    done = carol_client.post(
        f"/invite/{token}",
        {
            "action": "create",
            "new-username": "carol",
            "new-password1": NEW_PASSWORD,
            "new-password2": NEW_PASSWORD,
        },
    )
    # Then she is signed in and lands on the portal, a member with the role
    assert done.status_code == 302 and done["Location"] == "/admin/"
    carol = User.objects.get(username="carol")
    assert carol.email == "carol@example.com" and carol.is_staff
    assert carol.check_password(NEW_PASSWORD)
    membership = Membership.objects.get(tenant=tenant, user=carol)
    assert membership.role == Role.SUPPORT
    home = carol_client.get("/admin/")
    assert home.status_code == 200 and "Welcome to" in home.content.decode()
    # And the membership names Ada as the actor; the acceptance names Carol
    granted = Event.objects.get(tenant=tenant, code=EventCode.MEMBERSHIP_GRANTED)
    assert (granted.actor_type, granted.actor_id) == ("user", str(ada.pk))
    assert granted.payload["invitation_id"] == str(invitation.pk)
    accepted = Event.objects.get(tenant=tenant, code=EventCode.INVITATION_ACCEPTED)
    assert accepted.actor_id == str(carol.pk)
    invitation.refresh_from_db()
    assert invitation.accepted_at is not None and invitation.accepted_by_id == carol.pk

    # And the link works once: opened again it is refused, and nothing is written
    before = _written(tenant)
    again = Client()
    assert again.get(f"/invite/{token}").status_code == 410
    posted = again.post(
        f"/invite/{token}",
        {
            "action": "create",
            "new-username": "carol2",
            "new-password1": NEW_PASSWORD,
            "new-password2": NEW_PASSWORD,
        },
    )
    assert posted.status_code == 410
    assert "accepted already" in posted.content.decode()
    assert _written(tenant) == before


def test_an_existing_account_signs_in_then_accepts(
    ada: User, tenant: Tenant, other_tenant: Tenant, invited: str
):
    # Given Bob, a member of another tenant, opens the link signed out
    bob = _person("bob", other_tenant, Role.REVIEWER)
    page = Client().get(f"/invite/{invited}")
    assert "/admin/login/?next=%2Finvite%2F" in page.content.decode()
    # When he signs in and accepts
    client = _client(bob)
    assert "Accept as bob" in client.get(f"/invite/{invited}").content.decode()
    done = client.post(f"/invite/{invited}", {"action": "accept"})
    # Then he is a member of both tenants, with the invited role here
    assert done.status_code == 302
    assert Membership.objects.get(tenant=tenant, user=bob).role == Role.SUPPORT
    assert Membership.objects.get(tenant=other_tenant, user=bob).role == Role.REVIEWER
    assert Event.objects.filter(
        tenant=tenant, code=EventCode.MEMBERSHIP_GRANTED, actor_id=str(ada.pk)
    ).exists()


def test_a_member_already_keeps_their_role(ada: User, tenant: Tenant, invited: str):
    # Given the link reaches someone who is a reviewer of the tenant already
    rex = _person("rex", tenant, Role.REVIEWER)
    # When they accept it
    done = _client(rex).post(f"/invite/{invited}", {"action": "accept"})
    # Then their role is unchanged, no membership is granted, and the link is spent
    assert done.status_code == 302
    assert Membership.objects.get(tenant=tenant, user=rex).role == Role.REVIEWER
    assert not Event.objects.filter(
        tenant=tenant, code=EventCode.MEMBERSHIP_GRANTED, payload__username="rex"
    ).exists()
    accepted = Event.objects.get(tenant=tenant, code=EventCode.INVITATION_ACCEPTED)
    assert accepted.payload["already_member"] is True
    assert Client().get(f"/invite/{invited}").status_code == 410


@pytest.mark.parametrize(
    "kind", ["unknown", "tampered", "truncated", "overlong", "not-url-safe"]
)
def test_a_bad_link_answers_404_and_writes_nothing(
    tenant: Tenant, invited: str, kind: str
):
    token = {
        "unknown": secrets.token_urlsafe(32),
        "tampered": invited[:-1] + ("A" if invited[-1] != "A" else "B"),
        "truncated": invited[:20],
        "overlong": invited * 3,
        "not-url-safe": "%00%27;--",
    }[kind]
    before = _written(tenant)
    client = Client()
    page = client.get(f"/invite/{token}")
    assert page.status_code == 404
    assert "not valid" in page.content.decode()
    posted = client.post(
        f"/invite/{token}",
        {
            "action": "create",
            "new-username": "mallory",
            "new-password1": NEW_PASSWORD,
            "new-password2": NEW_PASSWORD,
        },
    )
    assert posted.status_code == 404
    assert _written(tenant) == before
    assert not User.objects.filter(username="mallory").exists()


def test_an_expired_link_answers_410_and_writes_nothing(tenant: Tenant, invited: str):
    before = _written(tenant)
    with db_clock_offset("7 days 1 second"):
        client = Client()
        page = client.get(f"/invite/{invited}")
        assert page.status_code == 410 and "expired" in page.content.decode()
        posted = client.post(
            f"/invite/{invited}",
            {
                "action": "create",
                "new-username": "late",
                "new-password1": NEW_PASSWORD,
                "new-password2": NEW_PASSWORD,
            },
        )
        assert posted.status_code == 410
    assert _written(tenant) == before
    # A moment before the week is out it still works.
    with db_clock_offset("6 days 23 hours"):
        assert Client().get(f"/invite/{invited}").status_code == 200


def test_inviting_an_address_again_replaces_the_open_invitation(
    ada: User,
    tenant: Tenant,
    invited: str,
    smtp: Inbox,  # noqa: F811
):
    # When Ada invites the same address again (another case), as admin this time
    assert (
        _invite(_client(ada), tenant, "carol@EXAMPLE.com", "admin").status_code == 302
    )
    second = _token(smtp)
    # Then one open invitation holds the new token and role; the first link is dead
    invitation = Invitation.objects.get(tenant=tenant)
    assert invitation.role == Role.ADMIN
    assert invitation.token_hash == hashlib.sha256(second.encode()).hexdigest()
    assert Client().get(f"/invite/{invited}").status_code == 404
    assert Client().get(f"/invite/{second}").status_code == 200
    sent = Event.objects.filter(tenant=tenant, code=EventCode.INVITATION_SENT)
    assert [e.payload["replaced"] for e in sent.order_by("pk")] == [False, True]


def test_a_link_dies_with_its_inviters_admin_role(
    ada: User, tenant: Tenant, invited: str
):
    # Given a second admin demotes Ada after she sent the invitation
    _person("grace", tenant, Role.ADMIN)
    portal_services.membership_grant(tenant=tenant, user=ada, role=Role.REVIEWER)
    before = _written(tenant)
    # Then the link is refused and nothing is written
    page = Client().post(
        f"/invite/{invited}",
        {
            "action": "create",
            "new-username": "carol",
            "new-password1": NEW_PASSWORD,
            "new-password2": NEW_PASSWORD,
        },
    )
    assert page.status_code == 410
    assert "no longer administers" in page.content.decode()
    assert _written(tenant) == before


def test_a_taken_username_or_weak_password_is_refused_on_the_page(
    tenant: Tenant, invited: str
):
    _person("carol")
    before = _written(tenant)
    for username, password, says in [
        ("carol", NEW_PASSWORD, "already exists"),
        ("carol-new", "password", "too common"),
    ]:
        page = Client().post(
            f"/invite/{invited}",
            {
                "action": "create",
                "new-username": username,
                "new-password1": password,
                "new-password2": password,
            },
        )
        assert page.status_code == 400
        assert says in page.content.decode()
    assert _written(tenant) == before


def test_only_the_tenants_admins_may_invite(
    ada: User,
    tenant: Tenant,
    other_tenant: Tenant,
    smtp: Inbox,  # noqa: F811
):
    rex = _person("rex", tenant, Role.REVIEWER)
    sam = _person("sam", tenant, Role.SUPPORT)
    olga = _person("olga", other_tenant, Role.ADMIN)
    # A reviewer or support member of the tenant does not get the page
    for person in (rex, sam):
        client = _client(person)
        assert client.get(ADD).status_code == 403
        assert _invite(client, tenant, "x@example.com").status_code == 403
    # The admin of another tenant cannot pick this tenant
    refused = _invite(_client(olga), tenant, "x@example.com")
    assert refused.status_code == 200
    assert "Select a valid choice" in refused.content.decode()
    # Nor can the service be called for it
    with pytest.raises(TenantNotVisible):
        invitations.invitation_create(
            tenant=tenant, by=olga, email="x@example.com", role=Role.ADMIN
        )
    assert not Invitation.objects.filter(tenant=tenant).exists()
    assert smtp.messages == []


def test_an_unreachable_mail_server_is_told_and_inviting_again_resends(
    ada: User, tenant: Tenant, settings: Any
):
    from tests.support.net import free_port

    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", free_port()
    client = _client(ada)
    response = client.post(
        ADD,
        {"tenant": str(tenant.pk), "email": "dan@example.com", "role": "support"},
        follow=True,
    )
    assert "could not be sent" in response.content.decode()
    # The invitation is stored (its event too); inviting again sends a new link.
    assert Invitation.objects.filter(tenant=tenant, email="dan@example.com").exists()
