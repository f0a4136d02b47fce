"""Writes of tenancy and identity."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from . import db as portal_db
from . import roles, selectors
from .exceptions import KeyRevoked, ValidationFailed
from .models import (
    Agent,
    AgentGrant,
    AgentKey,
    EventsOnDelete,
    Invitation,
    Membership,
    Role,
    Tenant,
)

# "agp_" marks a portal key in logs and secret scanners; the part before the dot is
# the lookup prefix, stored in clear.
KEY_PREFIX_MARK = "agp_"


@dataclass(frozen=True, kw_only=True)
class IssuedKey:
    key: AgentKey
    secret: str  # shown once; only its hash is stored


@transaction.atomic(durable=True)
def tenant_create(
    *, slug: str, name: str, events_on_delete: str = EventsOnDelete.KEEP
) -> Tenant:
    """Create a tenant."""
    return tenant_write(slug=slug, name=name, events_on_delete=events_on_delete)


def tenant_write(
    *, slug: str, name: str, events_on_delete: str = EventsOnDelete.KEEP
) -> Tenant:
    """Create a tenant in the caller's transaction (with its first members).

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    return Tenant.objects.create(
        slug=slug, name=name, events_on_delete=events_on_delete
    )


@transaction.atomic(durable=True)
def agent_create(*, tenant: Tenant, name: str) -> Agent:
    """Create an agent (an API identity) in the tenant."""
    return Agent.objects.create(tenant=tenant, name=name)


@transaction.atomic(durable=True)
def agent_key_issue(
    *, agent: Agent, expires_at: dt.datetime | None = None
) -> IssuedKey:
    """Issue a new API key for the agent; the secret is returned once, never stored.

    Raises:
        ValidationFailed: ``expires_at`` is not in the future.
    """
    return agent_key_write(agent=agent, expires_at=expires_at)


def agent_key_write(
    *, agent: Agent, expires_at: dt.datetime | None = None
) -> IssuedKey:
    """Mint and store a key, in the caller's transaction (the one way keys are made).

    ``expires_at`` (optional) is when it stops authenticating, on the database clock.

    Raises:
        TransactionRequired: called outside a transaction.
        ValidationFailed: ``expires_at`` is not in the future.
    """
    portal_db.require_transaction()
    if expires_at is not None:
        _require_future(expires_at)
    prefix = KEY_PREFIX_MARK + secrets.token_hex(6)
    secret = f"{prefix}.{secrets.token_urlsafe(32)}"
    key = AgentKey.objects.create(
        tenant_id=agent.tenant_id,
        agent=agent,
        prefix=prefix,
        key_hash=selectors.agent_key_hash(secret),
        expires_at=expires_at,
    )
    return IssuedKey(key=key, secret=secret)


def _require_future(moment: dt.datetime) -> None:
    """Refuse an expiry that has passed already (``app_now()``, the database clock)."""
    if moment.tzinfo is None:
        raise ValidationFailed("Give the time with its UTC offset.", field="expires_at")
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s > app_now()", [moment])
        (future,) = cursor.fetchone()
    if not future:
        raise ValidationFailed(
            "The expiry must be in the future.",
            field="expires_at",
            value=moment.isoformat(),
        )


def agent_key_expire_write(*, key: AgentKey, expires_at: dt.datetime) -> AgentKey:
    """Set when a key stops authenticating, in the caller's transaction.

    An earlier expiry already set is kept (a cutoff only moves closer); a revoked
    key stays revoked.

    Raises:
        TransactionRequired: called outside a transaction.
        ValidationFailed: ``expires_at`` is not in the future.
    """
    portal_db.require_transaction()
    _require_future(expires_at)
    AgentKey.objects.filter(tenant_id=key.tenant_id, pk=key.pk).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=expires_at)
    ).update(expires_at=expires_at)
    key.refresh_from_db()
    return key


@transaction.atomic(durable=True)
def agent_key_rotate(*, key: AgentKey, old_valid_until: dt.datetime) -> IssuedKey:
    """Rotate with overlap: a new key for the same agent now; the old one keeps
    working until ``old_valid_until``, then only the new one does.

    Raises:
        ValidationFailed: ``old_valid_until`` is not in the future.
        KeyRevoked: the old key is revoked (nothing to rotate from).
    """
    return agent_key_rotate_write(key=key, old_valid_until=old_valid_until)


def agent_key_rotate_write(*, key: AgentKey, old_valid_until: dt.datetime) -> IssuedKey:
    """``agent_key_rotate`` in the caller's transaction.

    Raises:
        TransactionRequired: called outside a transaction.
        ValidationFailed: ``old_valid_until`` is not in the future.
        KeyRevoked: the old key is revoked.
    """
    portal_db.require_transaction()
    old = AgentKey.objects.select_for_update().get(tenant_id=key.tenant_id, pk=key.pk)
    if old.revoked_at is not None:
        raise KeyRevoked(key_prefix=old.prefix)
    agent_key_expire_write(key=old, expires_at=old_valid_until)
    return agent_key_write(agent=old.agent)


@transaction.atomic(durable=True)
def agent_key_replace(*, agent: Agent) -> tuple[IssuedKey, list[AgentKey]]:
    """Issue a key and revoke every other live key of the agent, together.

    For the demo seed, which prints a fresh key on every start: one demo key is
    valid at a time. Returns the new key and the keys it revoked.
    """
    issued = agent_key_write(agent=agent)
    others = list(
        AgentKey.objects.filter(
            tenant_id=agent.tenant_id, agent=agent, revoked_at__isnull=True
        ).exclude(pk=issued.key.pk)
    )
    return issued, [agent_key_revoke_write(key=other) for other in others]


@transaction.atomic(durable=True)
def membership_grant(
    *, tenant: Tenant, user: AbstractBaseUser, role: Role
) -> Membership:
    """Give the user a role in the tenant (replacing any role held before)."""
    return membership_write(tenant=tenant, user_id=user.pk, role=role)


def membership_write(*, tenant: Tenant, user_id: int, role: str) -> Membership:
    """Set the user's role and the object permissions it carries, in the caller's txn.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    membership, _ = Membership.objects.update_or_create(
        tenant=tenant, user_id=user_id, defaults={"role": role}
    )
    roles.role_permissions_set(user_id=user_id, tenant=tenant, role=role)
    return membership


@dataclass(frozen=True, kw_only=True)
class IssuedInvitation:
    invitation: Invitation
    token: str  # goes into the e-mailed link once; only its hash is stored
    replaced: bool  # an open invitation to the address got this new token


def invitation_write(
    *, tenant: Tenant, invited_by_id: int, email: str, role: str, valid_s: int
) -> IssuedInvitation:
    """Store an invitation with a fresh token, in the caller's transaction.

    The address's open invitation in the tenant, if any, is given the new token,
    role, inviter and expiry (``valid_s`` from now on the database clock): its old
    link finds nothing from then on. The caller holds the tenant row's lock, so two
    invitations of one address cannot race to the partial unique index.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    token = secrets.token_urlsafe(32)
    with connection.cursor() as cursor:
        cursor.execute("SELECT app_now() + make_interval(secs => %s)", [valid_s])
        (expires_at,) = cursor.fetchone()
    values = {
        "role": role,
        "token_hash": selectors.invitation_token_hash(token),
        "invited_by_id": invited_by_id,
        "expires_at": expires_at,
    }
    email = email.lower()
    invitation = (
        Invitation.objects.select_for_update()
        .filter(tenant=tenant, email=email, accepted_at__isnull=True)
        .first()
    )
    if invitation is None:
        invitation = Invitation.objects.create(tenant=tenant, email=email, **values)
        return IssuedInvitation(invitation=invitation, token=token, replaced=False)
    Invitation.objects.filter(tenant=tenant, pk=invitation.pk).update(**values)
    invitation.refresh_from_db()
    return IssuedInvitation(invitation=invitation, token=token, replaced=True)


def invitation_consume_write(*, invitation: Invitation, user_id: int) -> Invitation:
    """Mark an open invitation taken up by the user, in the caller's transaction.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    Invitation.objects.filter(
        tenant_id=invitation.tenant_id, pk=invitation.pk, accepted_at__isnull=True
    ).update(accepted_at=Now(), accepted_by_id=user_id)
    invitation.refresh_from_db()
    return invitation


def membership_delete(*, membership: Membership) -> None:
    """Remove a membership and its permissions, in the caller's transaction."""
    portal_db.require_transaction()
    Membership.objects.filter(tenant_id=membership.tenant_id, pk=membership.pk).delete()
    roles.role_permissions_set(
        user_id=membership.user_id, tenant=membership.tenant, role=None
    )


@transaction.atomic(durable=True)
def agent_key_revoke(*, key: AgentKey) -> AgentKey:
    """Revoke a key: it authenticates nobody from the next request on."""
    return agent_key_revoke_write(key=key)


def agent_key_revoke_write(*, key: AgentKey) -> AgentKey:
    """Revoke a key in the caller's transaction (a revoked key stays revoked)."""
    portal_db.require_transaction()
    AgentKey.objects.filter(
        tenant_id=key.tenant_id, pk=key.pk, revoked_at__isnull=True
    ).update(revoked_at=Now())
    key.refresh_from_db()
    return key


@transaction.atomic(durable=True)
def agent_grant(*, agent: Agent, action: str, target: str) -> AgentGrant:
    """Allow the agent to reserve ``action`` on ``target`` (``*``: any target)."""
    return agent_grant_write(agent=agent, action=action, target=target)


def agent_grant_write(*, agent: Agent, action: str, target: str) -> AgentGrant:
    """Add a grant in the caller's transaction; an existing one is returned."""
    portal_db.require_transaction()
    grant, _ = AgentGrant.objects.get_or_create(
        tenant_id=agent.tenant_id, agent=agent, action=action, target=target
    )
    return grant


@transaction.atomic(durable=True)
def agent_grant_revoke(*, agent: Agent, action: str, target: str) -> int:
    """Withdraw a grant; queued work is stopped by the gateway's re-check."""
    return agent_grant_delete(agent=agent, action=action, target=target)


def agent_grant_delete(*, agent: Agent, action: str, target: str) -> int:
    """Withdraw a grant in the caller's transaction; returns how many went."""
    portal_db.require_transaction()
    deleted, _ = AgentGrant.objects.filter(
        tenant_id=agent.tenant_id, agent=agent, action=action, target=target
    ).delete()
    return deleted
