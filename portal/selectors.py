"""Reads of tenancy and identity."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from dataclasses import dataclass
from typing import Literal

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from . import db as portal_db
from . import scope
from .exceptions import TenantNotFound
from .models import Agent, AgentGrant, AgentKey, Invitation, Tenant
from .roles import tenant_ids_with_perm


def tenant_get(*, tenant_id: uuid.UUID | str) -> Tenant:
    """The live tenant with this id.

    Raises:
        TenantNotFound: no such tenant, or it was deleted.
    """
    try:
        return Tenant.objects.get(pk=tenant_id, deleted_at__isnull=True)
    except (Tenant.DoesNotExist, ValueError):
        raise TenantNotFound(tenant_id=str(tenant_id)) from None


def agent_key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


KeyStatus = Literal["live", "revoked", "expired"]


@dataclass(frozen=True, kw_only=True)
class RateWindow:
    """An agent's request count in its current fixed window, with this request, and
    the seconds until the window ends (``AgentRateThrottle`` decides by them)."""

    requests: int
    left_s: float


@dataclass(frozen=True, kw_only=True)
class KeyCheck:
    """A genuine key (its secret matched) and whether it authenticates now."""

    key: AgentKey
    status: KeyStatus
    # Set when the lookup was asked to count the request and the key authenticates.
    window: RateWindow | None = None


# A key's ``last_used_at`` is written at most once in this many seconds.
LAST_USED_RESOLUTION_S = 60


def agent_key_authenticate(
    *,
    secret: str,
    count_in_window_s: int | None = None,
    mark_used: bool = False,
) -> KeyCheck | None:
    """The key a presented secret belongs to, with its status; None if no key matches.

    The prefix and the hash find the row; the hash is compared again in constant
    time. Only a ``live`` key authenticates: a revoked one, one past its
    ``expires_at`` (database clock), an inactive agent or a deleted tenant do not
    (``revoked``/``expired`` are told to the holder of the exact secret only; anyone
    else learns nothing).

    With ``count_in_window_s``, a key that authenticates and whose agent and tenant
    are not frozen also counts the request in the agent's fixed window of that many
    seconds (``AgentRequestWindow``), and ``window`` says where the count stands.
    With ``mark_used`` such a key's ``last_used_at`` is set when it is unset or
    older than ``LAST_USED_RESOLUTION_S`` (the returned key holds the value read).
    One statement, one round trip, outside any transaction: the database function
    ``portal_agent_key_authenticate`` (portal migrations 0016, 0017) discovers the
    key's tenant, reads the key in that tenant's scope under row-level security,
    counts, marks, and leaves the scope as it was.
    """
    prefix, dot, _ = secret.partition(".")
    if not dot or len(prefix) > 16:
        return None
    key_hash = agent_key_hash(secret)
    with connection.cursor() as cursor:
        cursor.execute(
            _AUTHENTICATE,
            [
                prefix,
                key_hash,
                count_in_window_s,
                LAST_USED_RESOLUTION_S if mark_used else None,
            ],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    agent_at = len(_KEY_FIELDS)
    tenant_at = agent_at + len(_AGENT_FIELDS)
    key = portal_db.model_from_row(AgentKey, _KEY_FIELDS, row[:agent_at])
    agent = portal_db.model_from_row(Agent, _AGENT_FIELDS, row[agent_at:tenant_at])
    agent.tenant = portal_db.model_from_row(Tenant, _TENANT_FIELDS, row[tenant_at:-3])
    key.agent = agent
    expired, requests, left_s = row[-3:]
    if not hmac.compare_digest(key.key_hash, key_hash):
        return None
    if key.revoked_at is not None:
        return KeyCheck(key=key, status="revoked")
    if not agent.is_active or agent.tenant.deleted_at is not None:
        return None
    if expired:
        return KeyCheck(key=key, status="expired")
    window = None
    if requests is not None:
        window = RateWindow(requests=int(requests), left_s=float(left_s))
    return KeyCheck(key=key, status="live", window=window)


# Each row type's columns, read out of the function's composite values.
_KEY_FIELDS, _KEY_COLUMNS = portal_db.returning_columns(AgentKey, "(r.o_key)")
_AGENT_FIELDS, _AGENT_COLUMNS = portal_db.returning_columns(Agent, "(r.o_agent)")
_TENANT_FIELDS, _TENANT_COLUMNS = portal_db.returning_columns(Tenant, "(r.o_tenant)")
# The key, its agent and the agent's tenant in one fixed statement: it runs on every
# API request. Building the equal ORM query cost about as much client CPU as the
# rest of the authentication (docs/performance-log.md, "One round trip for BEGIN and
# the scope"); the function saves the discovery, the scoped read's BEGIN and COMMIT
# and the rate window's three round trips (issue 23).
_AUTHENTICATE = f"""
SELECT {_KEY_COLUMNS}, {_AGENT_COLUMNS}, {_TENANT_COLUMNS},
       r.o_expired, r.o_requests, r.o_left_s
FROM portal_agent_key_authenticate(%s, %s, %s, %s) r
"""


# One fixed statement rather than an ORM query: it runs on every reservation and
# gateway execution, and building the query cost more client CPU than the rest of a
# reservation (docs/performance-log.md, issue 11); fixed text is also prepared once
# per connection.
AGENT_MAY_EXISTS = f"""EXISTS (
    SELECT 1 FROM {AgentGrant._meta.db_table}
    WHERE tenant_id = %(tenant_id)s AND agent_id = %(agent_id)s
      AND action = %(action)s AND target IN (%(target)s, '*')
)"""
"""``agent_may``'s condition, with named parameters (``tenant_id``, ``agent_id``,
``action``, ``target``), for a hot path that reads it in a statement of its own."""
_AGENT_MAY = f"SELECT {AGENT_MAY_EXISTS}"


def agent_may(
    *, tenant: Tenant, agent_id: uuid.UUID | str, action: str, target: str
) -> bool:
    """Whether the agent holds a grant for this action on this target (or on ``*``).

    Raises:
        ValueError: ``agent_id`` is not a UUID.
    """
    agent = agent_id if isinstance(agent_id, uuid.UUID) else uuid.UUID(agent_id)
    with connection.cursor() as cursor:
        cursor.execute(
            _AGENT_MAY,
            {
                "tenant_id": tenant.pk,
                "agent_id": agent,
                "action": action,
                "target": target,
            },
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def tenant_for_person(
    *, user: AbstractBaseUser | AnonymousUser, slug: str, perm: str
) -> Tenant:
    """A live tenant on which the user's membership carries ``perm``.

    Raises:
        TenantNotFound: no such tenant, or the user lacks ``perm`` there.
    """
    ids = tenant_ids_with_perm(user=user, perm=perm)  # type: ignore[arg-type]
    tenant = Tenant.objects.filter(pk__in=ids, slug=slug).first()
    if tenant is None:
        raise TenantNotFound(slug=slug)
    return tenant


# A minted invitation token is 43 characters (services.invitation_token_new); a
# longer one is no invitation's, and is not hashed or looked up.
INVITATION_TOKEN_MAX = 64

InvitationStatus = Literal["open", "used", "expired"]


@dataclass(frozen=True, kw_only=True)
class InvitationCheck:
    """The invitation a link names, and whether it can still be taken up."""

    invitation: Invitation
    status: InvitationStatus


def invitation_token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invitation_tenant_ids(*, token: str) -> list[str]:
    """The tenant of the invitation this link's token names ([] if none).

    Asked of the discovery function ``portal_invitation_tenant`` by the token's
    hash, before any scope exists: only the holder of the link learns the tenant.
    The invitation itself is then read in that tenant's scope.
    """
    if not token or len(token) > INVITATION_TOKEN_MAX:
        return []
    return scope.discover("portal_invitation_tenant", invitation_token_hash(token))


def invitation_check(*, token: str, lock: bool = False) -> InvitationCheck | None:
    """The invitation this token names, read in the current scope (the tenant
    ``invitation_tenant_ids`` found); None for an unknown or altered token or a
    deleted tenant's invitation. ``expired`` is read on the database clock.

    ``lock`` takes the row ``FOR UPDATE`` (the caller's transaction), so that of
    two acceptances of one link the second sees it ``used``.
    """
    if not token or len(token) > INVITATION_TOKEN_MAX:
        return None
    rows = Invitation.objects.select_related("tenant", "invited_by").annotate(
        expired=RawSQL(
            "portal_invitation.expires_at <= app_now()", [], output_field=BooleanField()
        )
    )
    if lock:
        rows = rows.select_for_update(of=("self",))
    invitation = rows.filter(token_hash=invitation_token_hash(token)).first()
    if invitation is None or invitation.tenant.deleted_at is not None:
        return None
    if invitation.accepted_at is not None:
        return InvitationCheck(invitation=invitation, status="used")
    if invitation.expired:
        return InvitationCheck(invitation=invitation, status="expired")
    return InvitationCheck(invitation=invitation, status="open")
