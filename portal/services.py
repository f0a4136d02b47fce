"""Writes of tenancy and identity."""

from __future__ import annotations

import datetime as dt
import secrets
import time
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from . import db as portal_db
from . import roles, selectors
from .models import (
    Agent,
    AgentGrant,
    AgentKey,
    EventsOnDelete,
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
    return Tenant.objects.create(
        slug=slug, name=name, events_on_delete=events_on_delete
    )


@transaction.atomic(durable=True)
def agent_create(*, tenant: Tenant, name: str) -> Agent:
    """Create an agent (an API identity) in the tenant."""
    return Agent.objects.create(tenant=tenant, name=name)


@transaction.atomic(durable=True)
def agent_key_issue(*, agent: Agent) -> IssuedKey:
    """Issue a new API key for the agent; the secret is returned once, never stored."""
    return agent_key_write(agent=agent)


def agent_key_write(*, agent: Agent) -> IssuedKey:
    """Mint and store a key, in the caller's transaction (the one way keys are made).

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    prefix = KEY_PREFIX_MARK + secrets.token_hex(6)
    secret = f"{prefix}.{secrets.token_urlsafe(32)}"
    key = AgentKey.objects.create(
        tenant_id=agent.tenant_id,
        agent=agent,
        prefix=prefix,
        key_hash=selectors.agent_key_hash(secret),
    )
    return IssuedKey(key=key, secret=secret)


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


# Writing last_used_at on every request would turn each read into a write; once a
# minute is enough to tell a live key from a forgotten one.
LAST_USED_RESOLUTION_S = 60


# Keys this process recorded recently: skips even the conditional UPDATE's round trip
# on most requests (bench/api.py measured it on every one).
_marked_at: dict[object, float] = {}


def agent_key_mark_used(*, key: AgentKey) -> None:
    """Record that the key was used (at most one write a minute per key)."""
    now = time.monotonic()
    if now - _marked_at.get(key.pk, float("-inf")) < LAST_USED_RESOLUTION_S:
        return
    _marked_at[key.pk] = now
    AgentKey.objects.filter(pk=key.pk).filter(
        Q(last_used_at__isnull=True)
        | Q(last_used_at__lt=Now() - _seconds(LAST_USED_RESOLUTION_S))
    ).update(last_used_at=Now())


def _seconds(value: int) -> dt.timedelta:
    return dt.timedelta(seconds=value)


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
