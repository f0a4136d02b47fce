"""Inviting a member by e-mail (docs/portal.md, "Inviting a member").

A tenant administrator names an address and a role (:func:`invitation_send`): the
invitation is stored with the hash of a fresh token and an expiry
(``INVITATION_VALID_S``, on the database clock), one ``invitation.sent`` event names
the administrator, and after the commit the link goes out through Django's e-mail
backend (no transaction is open while it does). Inviting an address that has an
open invitation replaces its token: the older link stops working.

The person opens the link (console/invitation_page.py) and takes it up
(:func:`invitation_accept`) with a new account or the one they are signed in with:
in one transaction the row is locked, checked (open, not expired, the inviter still
administers the tenant), the membership is made with the invited role and the
inviter as the ``membership.granted`` actor, the invitation is consumed, and an
``invitation.accepted`` event names the person. The page runs before the person has
a tenant: the discovery function ``portal_invitation_tenant`` gives the tenant of
the token's hash, and everything after runs in that tenant's scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.urls import reverse

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal import scope
from portal import selectors as portal_selectors
from portal import services as portal_services
from portal.actors import Actor
from portal.exceptions import ValidationFailed
from portal.models import Membership, Role, Tenant, TenantPerm
from portal.roles import Person, has_tenant_perm, require_tenant_perm

from .exceptions import (
    InvitationExpired,
    InvitationNotFound,
    InvitationNotSent,
    InvitationUsed,
    InvitationWithdrawn,
)

# How long a link works: a week, as a colleague may be away for a few days.
INVITATION_VALID_S: Final = 7 * 24 * 3600


@dataclass(frozen=True, kw_only=True)
class NewAccount:
    """The account an invited person makes on the link's page (validated there)."""

    username: str
    password: str


@dataclass(frozen=True, kw_only=True)
class Accepted:
    membership: Membership
    user: User
    # False: the person was a member already; their role was left as it was.
    granted: bool


def invitation_link(token: str) -> str:
    """The link the e-mail carries, under ``PORTAL_PUBLIC_URL``."""
    path = reverse("invitation", kwargs={"token": token})
    return settings.PORTAL_PUBLIC_URL.rstrip("/") + path


@transaction.atomic(durable=True)
def invitation_create(
    *, tenant: Tenant, by: Person, email: str, role: str
) -> portal_services.IssuedInvitation:
    """Store an invitation of ``email`` to ``role`` and its ``invitation.sent``
    event, together; the token comes back once, for the e-mail.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        ValidationFailed: not an e-mail address, or an unknown role.
    """
    return invitation_record(tenant=tenant, by=by, email=email, role=role)


def invitation_record(
    *, tenant: Tenant, by: Person, email: str, role: str
) -> portal_services.IssuedInvitation:
    """``invitation_create`` in the caller's transaction (console/tenants.py makes a
    tenant and invites its first administrator in one).

    Raises:
        TransactionRequired: called outside a transaction.
        PermissionDenied, TenantNotVisible, ValidationFailed: as ``invitation_create``.
    """
    portal_db.require_transaction()
    require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)
    if role not in Role.values:
        raise ValidationFailed(field="role", value=str(role)[:40])
    email = email.strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationFailed("Give one e-mail address.", field="email") from None
    assert by.pk is not None  # require_tenant_perm refused the anonymous user
    Tenant.objects.select_for_update().get(pk=tenant.pk)  # one invite at a time
    issued = portal_services.invitation_write(
        tenant=tenant,
        invited_by_id=by.pk,
        email=email,
        role=role,
        valid_s=INVITATION_VALID_S,
    )
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.INVITATION_SENT,
        actor=Actor.of_user(by),
        data=payloads.InvitationSent(
            {
                "invitation_id": str(issued.invitation.pk),
                "email": email,
                "role": role,
                "replaced": issued.replaced,
                "expires_at": issued.invitation.expires_at.isoformat(),
            }
        ),
    )
    return issued


def invitation_mail(*, issued: portal_services.IssuedInvitation) -> None:
    """Send the invitation's e-mail, with no transaction open.

    Raises:
        InvitationNotSent: the mail server refused it or could not be reached; the
            invitation is stored, and inviting the address again sends a new link.
    """
    portal_db.forbid_transaction("the invitation e-mail goes over the network")
    invitation = issued.invitation
    tenant = invitation.tenant
    body = "\n".join(
        [
            f"You are invited to {tenant.name} on the agent governance portal, "
            f"as {Role(invitation.role).label}.",
            "",
            "Open this link to accept: you choose a username and password there,",
            "or sign in with the account you have.",
            "",
            invitation_link(issued.token),
            "",
            f"The link works once, until {invitation.expires_at:%Y-%m-%d %H:%M} UTC.",
            "If you did not expect this, ignore it: nothing happens without the link.",
        ]
    )
    message = EmailMessage(
        subject=f"Invitation to {tenant.name}",
        body=body,
        to=[invitation.email],
        connection=get_connection(timeout=settings.PORTAL_NOTIFY_TIMEOUT_S),
    )
    try:
        message.send()
    except OSError as error:  # smtplib's errors are OSErrors
        raise InvitationNotSent(
            email=invitation.email, error=str(error)[:200]
        ) from error


def invitation_send(
    *, tenant: Tenant, by: Person, email: str, role: str
) -> portal_services.IssuedInvitation:
    """Store the invitation (one transaction), then e-mail its link.

    Raises:
        PermissionDenied, TenantNotVisible, ValidationFailed: as ``invitation_create``
            (nothing stored).
        InvitationNotSent: stored, but the e-mail did not go out.
    """
    issued = invitation_create(tenant=tenant, by=by, email=email, role=role)
    invitation_mail(issued=issued)
    return issued


def invitation_accept(
    *, token: str, user: Person | None = None, account: NewAccount | None = None
) -> Accepted:
    """Take an invitation up, as the signed-in ``user`` or with a new ``account``.

    Guarantee: the membership (when the person had none), the consumed invitation
    and the events commit together, once: of two acceptances of one link the second
    finds it used. The person's existing role in the tenant is never changed.

    Raises:
        InvitationNotFound: no invitation has this token (unknown or altered).
        InvitationUsed, InvitationExpired, InvitationWithdrawn: it cannot be taken up.
        ValidationFailed: the new account's username is taken.
    """
    tenant_ids = portal_selectors.invitation_tenant_ids(token=token)
    if not tenant_ids:
        raise InvitationNotFound()
    with scope.tenant_scope(tenant_ids):
        return _accept(token=token, user=user, account=account)


@transaction.atomic(durable=True)
def _accept(*, token: str, user: Person | None, account: NewAccount | None) -> Accepted:
    check = portal_selectors.invitation_check(token=token, lock=True)
    if check is None:
        raise InvitationNotFound()
    if check.status == "used":
        raise InvitationUsed()
    if check.status == "expired":
        raise InvitationExpired()
    invitation = check.invitation
    tenant = invitation.tenant
    inviter = invitation.invited_by
    if not has_tenant_perm(user=inviter, perm=TenantPerm.MANAGE_TENANT, tenant=tenant):
        raise InvitationWithdrawn()
    person = _account(invitation_email=invitation.email, user=user, account=account)
    Tenant.objects.select_for_update().get(pk=tenant.pk)  # as membership_set
    membership = Membership.objects.filter(tenant=tenant, user_id=person.pk).first()
    granted = membership is None
    if membership is None:
        membership = portal_services.membership_write(
            tenant=tenant, user_id=person.pk, role=invitation.role
        )
        audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.MEMBERSHIP_GRANTED,
            actor=Actor.of_user(inviter),
            data=payloads.MembershipGranted(
                {
                    "user_id": person.pk,
                    "username": person.get_username(),
                    "role": invitation.role,
                    "previous_role": None,
                    "invitation_id": str(invitation.pk),
                }
            ),
        )
    portal_services.invitation_consume_write(invitation=invitation, user_id=person.pk)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.INVITATION_ACCEPTED,
        actor=Actor.of_user(person),
        data=payloads.InvitationAccepted(
            {
                "invitation_id": str(invitation.pk),
                "user_id": person.pk,
                "role": membership.role,
                "new_account": account is not None,
                "already_member": not granted,
            }
        ),
    )
    return Accepted(membership=membership, user=person, granted=granted)


def _account(
    *, invitation_email: str, user: Person | None, account: NewAccount | None
) -> User:
    """The signed-in person, or the new account (a staff account: the portal's
    pages are the admin's; what they show is the membership's)."""
    if account is None:
        if user is None or not user.is_authenticated or not user.is_active:
            raise ValidationFailed("Sign in or choose a username and password.")
        assert isinstance(user, User)  # signed in: not the anonymous user
        return user
    accounts = get_user_model().objects
    if accounts.filter(username=account.username).exists():
        raise ValidationFailed(
            "That username is taken; choose another.", field="username"
        )
    try:
        with transaction.atomic():  # a savepoint: a racing sign-up took the name
            created = accounts.create_user(
                account.username, email=invitation_email, password=account.password
            )
    except IntegrityError:
        raise ValidationFailed(
            "That username is taken; choose another.", field="username"
        ) from None
    created.is_staff = True
    created.save(update_fields=["is_staff"])
    return created
