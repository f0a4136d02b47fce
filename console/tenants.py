"""A new tenant and its first administrator: the platform operator's one way to
make a tenant (README, "A second tenant"; docs/portal.md, "A new tenant").

:func:`tenant_open` is the one business function: it checks the slug and the name
(a taken slug, or a name a live tenant has, is refused with the field it concerns),
writes the tenant and, in the new tenant's own trail, a ``tenant.created`` event
naming who made it. Tenants are made one at a time (a transaction-level advisory
lock), so two operators asking for one slug or name get one tenant and one clear
refusal, never a constraint error. Its two doors each add the first administrator
in the same transaction:

- the operator's page (``/admin/tenants/new/``, console/tenant_page.py):
  :func:`tenant_invite_admin` stores an invitation of the administrator's e-mail
  address to the administrator role (console/invitations.py), sent by the operator;
  the account is made when the person accepts the link. The e-mail goes out after
  the commit (:func:`tenant_invite_admin_send`).
- ``manage.py tenant_create SLUG --name NAME --admin USER``:
  :func:`tenant_with_account` makes a new staff account and its membership.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import connection, transaction

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal import scope
from portal import services as portal_services
from portal.actors import Actor
from portal.exceptions import PermissionDenied, ValidationFailed
from portal.models import EventsOnDelete, Role, Tenant
from portal.roles import Person

from . import invitations

SLUG_MAX: Final = Tenant._meta.get_field("slug").max_length or 63
NAME_MAX: Final = Tenant._meta.get_field("name").max_length or 200
# pg_advisory_xact_lock's key for "a tenant is being made" (any constant will do;
# this one reads "tenant" in ASCII).
_MAKING_TENANT: Final = 0x74656E616E74
# How the first administrator comes, as tenant.created says.
BY_INVITATION: Final = "invitation"
BY_ACCOUNT: Final = "account"


@dataclass(frozen=True, kw_only=True)
class InvitedAdmin:
    tenant: Tenant
    issued: portal_services.IssuedInvitation


def is_operator(person: Person) -> bool:
    """Whether the person is the platform operator (an active superuser)."""
    return bool(person.is_authenticated and person.is_active and person.is_superuser)


def require_operator(by: Person) -> None:
    """Only the platform operator makes tenants.

    Raises:
        PermissionDenied: anyone else, a tenant's administrator included.
    """
    if not is_operator(by):
        raise PermissionDenied("Only the platform operator makes tenants.")


def tenant_open(
    *,
    slug: str,
    name: str,
    actor: Actor,
    first_admin: str,
    events_on_delete: str = EventsOnDelete.KEEP,
) -> Tenant:
    """Make the tenant and its ``tenant.created`` event, in the caller's transaction.

    Raises:
        TransactionRequired: called outside a transaction.
        ValidationFailed: (``field`` ``slug`` or ``name``) not a slug, a length out
            of bounds, the slug taken (deleted tenants keep theirs), or the name
            held by a live tenant (compared without case).
    """
    portal_db.require_transaction()
    name = name.strip()
    if not 1 <= len(slug) <= SLUG_MAX:
        raise ValidationFailed(
            f"The slug must be 1 to {SLUG_MAX} characters.", field="slug"
        )
    try:
        validate_slug(slug)
    except ValidationError:
        raise ValidationFailed(
            f"The slug {slug!r} is not one: use letters, digits, - and _ only.",
            field="slug",
        ) from None
    if not 1 <= len(name) <= NAME_MAX:
        raise ValidationFailed(
            f"The name must be 1 to {NAME_MAX} characters.", field="name"
        )
    if events_on_delete not in EventsOnDelete.values:
        raise ValidationFailed(field="events_on_delete", value=events_on_delete[:20])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_MAKING_TENANT])
    if Tenant.objects.filter(slug=slug).exists():
        raise ValidationFailed(f"A tenant with the slug {slug!r} exists.", field="slug")
    if Tenant.objects.filter(name__iexact=name, deleted_at__isnull=True).exists():
        raise ValidationFailed(f"A tenant named {name!r} exists.", field="name")
    tenant = portal_services.tenant_write(
        slug=slug, name=name, events_on_delete=events_on_delete
    )
    with scope.tenant_scope([tenant.pk]):
        audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.TENANT_CREATED,
            actor=actor,
            data=payloads.TenantCreated(
                {
                    "slug": slug,
                    "name": name,
                    "events_on_delete": events_on_delete,
                    "first_admin": first_admin,
                }
            ),
        )
    return tenant


@transaction.atomic(durable=True)
def tenant_invite_admin(
    *,
    by: Person,
    slug: str,
    name: str,
    email: str,
    events_on_delete: str = EventsOnDelete.KEEP,
) -> InvitedAdmin:
    """The tenant, its ``tenant.created`` event and an invitation of ``email`` to be
    its administrator (``invitation.sent``), sent by the operator ``by``: all
    or nothing. The token comes back once, for the e-mail.

    Raises:
        PermissionDenied: ``by`` is not the platform operator.
        ValidationFailed: as :func:`tenant_open`, or (``field`` ``email``) not one
            e-mail address.
    """
    require_operator(by)
    tenant = tenant_open(
        slug=slug,
        name=name,
        actor=Actor.of_user(by),
        first_admin=BY_INVITATION,
        events_on_delete=events_on_delete,
    )
    with scope.tenant_scope([tenant.pk]):
        issued = invitations.invitation_record(
            tenant=tenant, by=by, email=email, role=Role.ADMIN
        )
    return InvitedAdmin(tenant=tenant, issued=issued)


def tenant_invite_admin_send(
    *,
    by: Person,
    slug: str,
    name: str,
    email: str,
    events_on_delete: str = EventsOnDelete.KEEP,
) -> InvitedAdmin:
    """:func:`tenant_invite_admin` (one transaction), then e-mail the link.

    Raises:
        PermissionDenied, ValidationFailed: as ``tenant_invite_admin`` (nothing
            written).
        InvitationNotSent: the tenant and the invitation are stored, but the
            e-mail did not go out (inviting the address again sends a new link).
    """
    made = tenant_invite_admin(
        by=by, slug=slug, name=name, email=email, events_on_delete=events_on_delete
    )
    invitations.invitation_mail(issued=made.issued)
    return made


@transaction.atomic(durable=True)
def tenant_with_account(
    *, slug: str, name: str, username: str, email: str, password: str, actor: Actor
) -> tuple[Tenant, User]:
    """The tenant, its ``tenant.created`` event, a new staff account (never a
    superuser) and its membership as the tenant's administrator with the
    ``membership.granted`` event: all or nothing.

    Raises:
        ValidationFailed: as :func:`tenant_open`, or (``field`` ``username``) the
            username is taken.
    """
    accounts = get_user_model().objects
    tenant = tenant_open(slug=slug, name=name, actor=actor, first_admin=BY_ACCOUNT)
    if accounts.filter(username=username).exists():
        raise ValidationFailed(
            f"An account {username!r} exists (a tenant administrator gives an "
            "existing account a role on the Memberships page).",
            field="username",
        )
    user = accounts.create_user(username, email=email, password=password)
    user.is_staff = True  # the admin's pages; what they show is the membership's
    user.save(update_fields=["is_staff"])
    with scope.tenant_scope([tenant.pk]):
        portal_services.membership_write(
            tenant=tenant, user_id=user.pk, role=Role.ADMIN
        )
        audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.MEMBERSHIP_GRANTED,
            actor=actor,
            data=payloads.MembershipGranted(
                {
                    "user_id": user.pk,
                    "username": username,
                    "role": Role.ADMIN.value,
                    "previous_role": None,
                }
            ),
        )
    return tenant, user
