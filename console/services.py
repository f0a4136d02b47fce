"""Changes a tenant administrator makes: each checks the role and writes one event.

Every service here takes the person (``by``), refuses unless their membership
carries ``manage_tenant`` on the tenant (portal/roles.py), and commits the change
with one event naming them as the actor. Secrets (a key's secret, a connector's
signing key) never go into the event. Contract and connector changes live with
their models in ``tasks.services`` and follow the same rule.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode, RetentionPolicy
from portal import db as portal_db
from portal import services as portal_services
from portal.actors import Actor
from portal.exceptions import ValidationFailed
from portal.models import (
    Agent,
    AgentGrant,
    AgentKey,
    Membership,
    Role,
    Tenant,
    TenantPerm,
    TrustTier,
)
from portal.roles import Person, require_tenant_perm

from .exceptions import LastAdministrator


def _manage(*, tenant: Tenant, by: Person) -> Actor:
    require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)
    return Actor.of_user(by)


def _event(*, tenant: Tenant, code: str, actor: Actor, data: payloads.Payload) -> None:
    audit_services.event_append(tenant_id=tenant.pk, code=code, actor=actor, data=data)


@transaction.atomic(durable=True)
def tenant_update(*, tenant: Tenant, by: Person, name: str) -> Tenant:
    """Change the tenant's name.

    Its event policy on deletion (``events_on_delete``) is chosen when the tenant is
    made and changed afterwards by the operator alone: the app role may not update
    it, since the tenant purge decides by it (docs/tenant-deletion.md).

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    actor = _manage(tenant=tenant, by=by)
    current = Tenant.objects.select_for_update().get(pk=tenant.pk)
    if current.name != name:
        Tenant.objects.filter(pk=tenant.pk).update(name=name)
        _event(
            tenant=tenant,
            code=EventCode.TENANT_CHANGED,
            actor=actor,
            data=payloads.TenantChanged({"changed": {"name": [current.name, name]}}),
        )
    current.refresh_from_db()
    return current


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def retention_policy_set(
    *, tenant: Tenant, by: Person, event_months: int, payload_days: int
) -> RetentionPolicy:
    """Set how long the tenant keeps its events and their payloads (docs/retention.md).

    Creates the tenant's policy when it has none (it kept the defaults until now).
    One ``tenant.changed`` event with ``{"retention_policy": {field: [before,
    after]}}`` for the values that changed, the defaults standing for "before" when
    there was no policy; nothing changed, no event.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        ValidationFailed: months outside 1 to 1200, or days outside 1 to 28 times months
            (payloads never outlive their events).
    """
    actor = _manage(tenant=tenant, by=by)
    if not 1 <= event_months <= 1200:
        raise ValidationFailed(field="event_months", value=event_months)
    if not 1 <= payload_days <= event_months * 28:
        raise ValidationFailed(field="payload_days", value=payload_days)
    policy = RetentionPolicy.objects.select_for_update().filter(tenant=tenant).first()
    before = (
        (policy.event_months, policy.payload_days)
        if policy
        else (
            settings.PORTAL_AUDIT_EVENT_RETENTION_MONTHS,
            settings.PORTAL_AUDIT_PAYLOAD_RETENTION_DAYS,
        )
    )
    changed = {
        field: [old, new]
        for field, old, new in (
            ("event_months", before[0], event_months),
            ("payload_days", before[1], payload_days),
        )
        if old != new
    }
    if policy is None:
        policy = RetentionPolicy.objects.create(
            tenant=tenant, event_months=event_months, payload_days=payload_days
        )
    elif changed:
        policy.event_months, policy.payload_days = event_months, payload_days
        policy.save(update_fields=["event_months", "payload_days"])
    if changed:
        _event(
            tenant=tenant,
            code=EventCode.TENANT_CHANGED,
            actor=actor,
            data=payloads.TenantChanged({"retention_policy": changed}),
        )
    return policy


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def agent_create(*, tenant: Tenant, by: Person, name: str) -> Agent:
    """Add an agent (an API identity) to the tenant; it has no key or grant yet.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    actor = _manage(tenant=tenant, by=by)
    agent = Agent.objects.create(tenant=tenant, name=name)
    _event(
        tenant=tenant,
        code=EventCode.AGENT_CREATED,
        actor=actor,
        data=payloads.AgentCreated({"agent_id": str(agent.pk), "name": name}),
    )
    return agent


def _agent_change(
    *,
    agent: Agent,
    actor: Actor,
    to: dict[str, Any],
    said: payloads.AgentSet,
) -> None:
    """Set the agent's columns ``to``; when any changed, one ``agent.changed`` event
    naming the agent and ``said``. Nothing changed, nothing written."""
    moved = (
        Agent.objects.filter(tenant_id=agent.tenant_id, pk=agent.pk)
        .exclude(**to)
        .update(**to)
    )
    if moved:
        _event(
            tenant=agent.tenant,
            code=EventCode.AGENT_CHANGED,
            actor=actor,
            data=payloads.AgentChanged(
                {"agent_id": str(agent.pk), "name": agent.name, **said}
            ),
        )


@transaction.atomic(durable=True)
def agent_set_active(*, agent: Agent, by: Person, is_active: bool) -> Agent:
    """Switch an agent on or off; an inactive agent's keys authenticate nobody.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    actor = _manage(tenant=agent.tenant, by=by)
    _agent_change(
        agent=agent,
        actor=actor,
        to={"is_active": is_active},
        said=payloads.AgentSet({"active": is_active}),
    )
    agent.refresh_from_db()
    return agent


@transaction.atomic(durable=True)
def agent_set_sponsor(*, agent: Agent, by: Person, sponsor_id: int | None) -> Agent:
    """Name the person answerable for the agent (a member of its tenant), or none;
    a policy's ``@separate_from_sponsor`` keeps them out of approving its calls.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        ValidationFailed: the sponsor is not a member of the tenant.
    """
    actor = _manage(tenant=agent.tenant, by=by)
    if (
        sponsor_id is not None
        and not Membership.objects.filter(
            tenant_id=agent.tenant_id, user_id=sponsor_id
        ).exists()
    ):
        raise ValidationFailed(
            "The sponsor must be a member of the tenant.", field="sponsor"
        )
    _agent_change(
        agent=agent,
        actor=actor,
        to={"sponsor_id": sponsor_id},
        said=payloads.AgentSet({"sponsor_id": sponsor_id}),
    )
    agent.refresh_from_db()
    return agent


MAX_AGENT_TAGS = 20
MAX_AGENT_TAG_CHARS = 50


@transaction.atomic(durable=True)
def agent_set_policy_attributes(
    *, agent: Agent, by: Person, trust_tier: str, tags: Sequence[str]
) -> Agent:
    """Set what the tenant's policies read of the agent: its trust tier and tags
    (``principal.trust_tier``, ``principal.tags``; docs/policies.md). Tags are
    kept once each, in order.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        ValidationFailed: an unknown tier, an empty or over-long tag, too many.
    """
    actor = _manage(tenant=agent.tenant, by=by)
    if trust_tier not in TrustTier.values:
        raise ValidationFailed(
            f"The trust tier is one of {', '.join(TrustTier.values)}.",
            field="trust_tier",
        )
    cleaned = list(dict.fromkeys(tag.strip() for tag in tags))
    if len(cleaned) > MAX_AGENT_TAGS or not all(
        0 < len(tag) <= MAX_AGENT_TAG_CHARS for tag in cleaned
    ):
        raise ValidationFailed(
            f"At most {MAX_AGENT_TAGS} tags of 1 to {MAX_AGENT_TAG_CHARS} characters.",
            field="tags",
        )
    _agent_change(
        agent=agent,
        actor=actor,
        to={"trust_tier": trust_tier, "tags": cleaned},
        said=payloads.AgentSet({"trust_tier": trust_tier, "tags": cleaned}),
    )
    agent.refresh_from_db()
    return agent


@transaction.atomic(durable=True)
def agent_key_issue(*, agent: Agent, by: Person) -> portal_services.IssuedKey:
    """Issue a key for the agent; its secret is returned once and stored nowhere.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    actor = _manage(tenant=agent.tenant, by=by)
    issued = portal_services.agent_key_write(agent=agent)
    _event(
        tenant=agent.tenant,
        code=EventCode.AGENT_KEY_ISSUED,
        actor=actor,
        data=payloads.AgentKeyIssued(
            {
                "agent_id": str(agent.pk),
                "agent": agent.name,
                "key_prefix": issued.key.prefix,
            }
        ),
    )
    return issued


@transaction.atomic(durable=True)
def agent_key_rotate(
    *, key: AgentKey, by: Person, old_valid_until: dt.datetime
) -> portal_services.IssuedKey:
    """Rotate a key with overlap: a new key now, the old one valid until the cutoff.

    One ``agent_key.issued`` event names the key it replaces and the cutoff.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        ValidationFailed: the cutoff is not in the future.
        KeyRevoked: the old key is revoked.
    """
    actor = _manage(tenant=key.tenant, by=by)
    return agent_key_rotate_as(key=key, actor=actor, old_valid_until=old_valid_until)


@transaction.atomic(durable=True)
def agent_key_expire(*, key: AgentKey, by: Person, expires_at: dt.datetime) -> AgentKey:
    """Set when a key stops authenticating (an earlier expiry is kept).

    Writes ``agent.changed`` with the key's prefix and expiry when it changed.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        ValidationFailed: ``expires_at`` is not in the future.
    """
    actor = _manage(tenant=key.tenant, by=by)
    return agent_key_expire_as(key=key, actor=actor, expires_at=expires_at)


@transaction.atomic(durable=True)
def agent_key_revoke(*, key: AgentKey, by: Person) -> AgentKey:
    """Revoke a key; revoking a revoked key changes nothing and writes no event.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    actor = _manage(tenant=key.tenant, by=by)
    return agent_key_revoke_as(key=key, actor=actor)


# The audited key changes themselves, for an actor already entitled to them: the
# services above (a tenant administrator) and ``manage.py agent_key`` (an operator,
# ``system:agent_key``) both go through these, in the caller's transaction.


def agent_key_rotate_as(
    *, key: AgentKey, actor: Actor, old_valid_until: dt.datetime
) -> portal_services.IssuedKey:
    """A new key for ``key``'s agent, ``key`` valid until the cutoff, and its
    ``agent_key.issued`` event. No role check: the caller decided.

    Raises:
        TransactionRequired: called outside a transaction.
        ValidationFailed: the cutoff is not in the future.
        KeyRevoked: the old key is revoked.
    """
    issued = portal_services.agent_key_rotate_write(
        key=key, old_valid_until=old_valid_until
    )
    key.refresh_from_db()
    _event(
        tenant=key.tenant,
        code=EventCode.AGENT_KEY_ISSUED,
        actor=actor,
        data=payloads.AgentKeyIssued(
            {
                "agent_id": str(key.agent_id),
                "key_prefix": issued.key.prefix,
                "rotated_from": key.prefix,
                "old_valid_until": (
                    key.expires_at.isoformat() if key.expires_at else None
                ),
            }
        ),
    )
    return issued


def agent_key_expire_as(
    *, key: AgentKey, actor: Actor, expires_at: dt.datetime
) -> AgentKey:
    """Set ``key``'s expiry (an earlier one is kept) and, when it changed, its
    ``agent.changed`` event. No role check: the caller decided.

    Raises:
        TransactionRequired: called outside a transaction.
        ValidationFailed: ``expires_at`` is not in the future.
    """
    before = key.expires_at
    key = portal_services.agent_key_expire_write(key=key, expires_at=expires_at)
    if key.expires_at != before:
        _event(
            tenant=key.tenant,
            code=EventCode.AGENT_CHANGED,
            actor=actor,
            data=payloads.AgentChanged(
                {
                    "agent_id": str(key.agent_id),
                    "key_prefix": key.prefix,
                    "key_expires_at": [
                        before.isoformat() if before else None,
                        key.expires_at.isoformat() if key.expires_at else None,
                    ],
                }
            ),
        )
    return key


def agent_key_revoke_as(*, key: AgentKey, actor: Actor) -> AgentKey:
    """Revoke ``key`` with its ``agent_key.revoked`` event; a revoked key changes
    nothing and writes no event. No role check: the caller decided.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    was_live = key.revoked_at is None
    key = portal_services.agent_key_revoke_write(key=key)
    if was_live:
        _event(
            tenant=key.tenant,
            code=EventCode.AGENT_KEY_REVOKED,
            actor=actor,
            data=payloads.AgentKeyRevoked(
                {"agent_id": str(key.agent_id), "key_prefix": key.prefix}
            ),
        )
    return key


@transaction.atomic(durable=True)
def agent_grant_add(
    *, agent: Agent, by: Person, action: str, target: str
) -> AgentGrant:
    """Allow the agent ``action`` on ``target`` (``*``: any target).

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        ValidationFailed: an empty action or target.
    """
    actor = _manage(tenant=agent.tenant, by=by)
    if not action.strip() or not target.strip():
        raise ValidationFailed("A grant names an action and a target.")
    grant = portal_services.agent_grant_write(agent=agent, action=action, target=target)
    _event(
        tenant=agent.tenant,
        code=EventCode.AGENT_GRANT_ADDED,
        actor=actor,
        data=payloads.AgentGrantAdded(
            {"agent_id": str(agent.pk), "action": action, "target": target}
        ),
    )
    return grant


@transaction.atomic(durable=True)
def agent_grant_revoke(*, grant: AgentGrant, by: Person) -> None:
    """Withdraw a grant; queued work is stopped by the gateway's re-check.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    actor = _manage(tenant=grant.tenant, by=by)
    removed = portal_services.agent_grant_delete(
        agent=grant.agent, action=grant.action, target=grant.target
    )
    if removed:
        _event(
            tenant=grant.tenant,
            code=EventCode.AGENT_GRANT_REVOKED,
            actor=actor,
            data=payloads.AgentGrantRevoked(
                {
                    "agent_id": str(grant.agent_id),
                    "action": grant.action,
                    "target": grant.target,
                }
            ),
        )


def _other_admins(*, tenant: Tenant, user_id: int) -> bool:
    return (
        Membership.objects.filter(tenant=tenant, role=Role.ADMIN)
        .exclude(user_id=user_id)
        .exists()
    )


@transaction.atomic(durable=True)
def membership_set(
    *, tenant: Tenant, by: Person, username: str, role: str
) -> Membership:
    """Give an existing account a role in the tenant, or change the role it has.

    Accounts are made by the platform operator; a tenant admin assigns roles.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        ValidationFailed: unknown role or no such account.
        LastAdministrator: the change would leave the tenant without an admin.
    """
    actor = _manage(tenant=tenant, by=by)
    if role not in Role.values:
        raise ValidationFailed(field="role", value=role)
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ValidationFailed(
            f"No active account has the username '{username[:150]}'. Accounts are "
            "made by the platform operator: ask them to create it, then add it "
            "here with its role.",
            field="username",
        )
    Tenant.objects.select_for_update().get(pk=tenant.pk)  # one role change at a time
    before = Membership.objects.filter(tenant=tenant, user_id=user.pk).first()
    if (
        before is not None
        and before.role == Role.ADMIN
        and role != Role.ADMIN
        and not _other_admins(tenant=tenant, user_id=user.pk)
    ):
        raise LastAdministrator(username=username)
    membership = portal_services.membership_write(
        tenant=tenant, user_id=user.pk, role=role
    )
    _event(
        tenant=tenant,
        code=EventCode.MEMBERSHIP_GRANTED,
        actor=actor,
        data=payloads.MembershipGranted(
            {
                "user_id": user.pk,
                "username": username,
                "role": role,
                "previous_role": before.role if before else None,
            }
        ),
    )
    return membership


@transaction.atomic(durable=True)
def membership_revoke(*, membership: Membership, by: Person) -> None:
    """Remove a person from the tenant, with every permission the role carried.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
        LastAdministrator: it is the tenant's only administrator.
    """
    tenant = membership.tenant
    actor = _manage(tenant=tenant, by=by)
    Tenant.objects.select_for_update().get(pk=tenant.pk)
    if membership.role == Role.ADMIN and not _other_admins(
        tenant=tenant, user_id=membership.user_id
    ):
        raise LastAdministrator(username=membership.user.get_username())
    portal_services.membership_delete(membership=membership)
    _event(
        tenant=tenant,
        code=EventCode.MEMBERSHIP_REVOKED,
        actor=actor,
        data=payloads.MembershipRevoked(
            {
                "user_id": membership.user_id,
                "username": membership.user.get_username(),
                "role": membership.role,
            }
        ),
    )
