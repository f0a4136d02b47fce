"""Routing's writes: assign a desk item, move it, and run its SLA clock.

An item is ``(item_kind, item_id)``; the item's app calls ``item_assign`` in the
transaction that creates the item, so the assignment, its event and its
notifications commit with it or not at all (docs/routing.md). Every move is an
event in the item's task chain naming who (or what) moved it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Final

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models import ProtectedError

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal import metrics, scope
from portal.actors import Actor
from portal.exceptions import NotFound
from portal.models import Tenant, TenantPerm
from portal.roles import Person, has_tenant_perm

from . import selectors
from .exceptions import (
    AssigneeNotAllowed,
    AssignmentNotFound,
    ItemClosed,
    NotAGroupMember,
    SetupRowInUse,
)
from .models import (
    Assignment,
    Channel,
    Group,
    GroupMember,
    ItemKind,
    Notification,
    RoutingRule,
    Webhook,
)

SLA: Final = Actor.system("sla")
# The group an item goes to when the tenant has no rule for it (made on first use).
DEFAULT_GROUP: Final = "Takeover desk"


def _desk_link(*, item_kind: str, task_id: uuid.UUID | None) -> str:
    base = settings.PORTAL_PUBLIC_URL.rstrip("/")
    if item_kind == ItemKind.APPROVAL:
        return f"{base}/admin/tasks/approval/waiting/"  # the approvals page
    if task_id is None:
        return f"{base}/admin/console/takeoveritem/"
    return f"{base}/admin/console/takeoveritem/{task_id}/change/"


def _notify(
    *,
    tenant: Tenant,
    event_id: uuid.UUID,
    code: str,
    assignment: Assignment,
    also_group_ids: Sequence[uuid.UUID] = (),
) -> int:
    """One notification per person to tell and per enabled webhook.

    The people: the item's person when it was given to one, else the members of
    its group and of ``also_group_ids`` (the other groups an approval's policy
    names); each only with ``email_enabled`` in one of those groups and an
    address, and once however many of the groups they are in. Codes and ids only:
    no field value, argument, evidence or address leaves in a message; the
    member's address is read when the e-mail is sent.
    """
    group_name = (
        Group.objects.filter(tenant=tenant, pk=assignment.group_id)
        .values_list("name", flat=True)
        .get()
    )
    facts = {
        "event": code,
        "item_kind": assignment.item_kind,
        "item_id": str(assignment.item_id),
        "task_id": str(assignment.task_id) if assignment.task_id else None,
        "reason_code": assignment.reason_code,
        "group": group_name,
        "escalate_at": assignment.escalate_at.isoformat(),
        "link": _desk_link(item_kind=assignment.item_kind, task_id=assignment.task_id),
    }
    group_ids = list(dict.fromkeys([assignment.group_id, *also_group_ids]))
    people = sorted(
        {
            member.user_id
            for member in selectors.group_members(tenant=tenant, group_ids=group_ids)
            if member.email_enabled
            and member.user.email
            and assignment.person_id in (None, member.user_id)
        }
    )
    recipients = [(Channel.EMAIL, str(user_id)) for user_id in people] + [
        (Channel.WEBHOOK, str(webhook.pk))
        for webhook in selectors.webhooks_enabled(tenant=tenant)
    ]
    Notification.objects.bulk_create(
        [
            Notification(
                tenant=tenant,
                event_id=event_id,
                channel=channel,
                recipient=recipient,
                facts=facts,
            )
            for channel, recipient in recipients
        ],
        ignore_conflicts=True,  # the same event never notifies one recipient twice
    )
    return len(recipients)


def item_assign(
    *,
    tenant: Tenant,
    item_kind: ItemKind,
    item_id: uuid.UUID,
    reason_code: str,
    task_id: uuid.UUID | None,
    actor: Actor,
    group_names: Sequence[str] = (),
) -> Assignment:
    """Route a new desk item to its group, in the caller's transaction.

    The reason code's rule (else the tenant's default rule, else the
    ``Takeover desk`` group with the default intervals) names the group and the
    SLA. ``group_names``, when the item names its own groups (an approval's
    policy): the first of them the tenant has holds the item instead of the rule's
    group, and every one the tenant has is told (each person once); the rule's SLA
    and backup group still hold. The assignment, a ``desk.item_assigned`` event and
    one notification per recipient commit with the item.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    rule = selectors.rule_for(tenant=tenant, reason_code=reason_code)
    if rule is not None:
        group_id = rule.group_id
        remind_s, escalate_s = rule.remind_after_s, rule.escalate_after_s
    else:
        group, _ = Group.objects.get_or_create(tenant=tenant, name=DEFAULT_GROUP)
        group_id = group.pk
        remind_s = settings.PORTAL_SLA_REMIND_AFTER_S
        escalate_s = settings.PORTAL_SLA_ESCALATE_AFTER_S
    named = selectors.group_ids_named(tenant=tenant, names=group_names)
    if named:
        group_id = named[0]
    now = portal_db.db_now()
    assignment = Assignment.objects.create(
        tenant=tenant,
        item_kind=item_kind,
        item_id=item_id,
        task_id=task_id,
        reason_code=reason_code,
        group_id=group_id,
        assigned_at=now,
        remind_at=now + dt.timedelta(seconds=remind_s),
        escalate_at=now + dt.timedelta(seconds=escalate_s),
    )
    event_id = audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.DESK_ITEM_ASSIGNED,
        actor=actor,
        task_id=task_id,
        reason=reason_code or None,
        data=payloads.DeskItemAssigned(
            {**_item(assignment), "told_group_ids": [str(g) for g in named[1:]]}
        ),
    )
    _notify(
        tenant=tenant,
        event_id=event_id,
        code=EventCode.DESK_ITEM_ASSIGNED,
        assignment=assignment,
        also_group_ids=named[1:],
    )
    return assignment


def _item(assignment: Assignment) -> payloads.DeskItem:
    return {
        "assignment_id": str(assignment.pk),
        "item_kind": assignment.item_kind,
        "item_id": str(assignment.item_id),
        "group_id": str(assignment.group_id),
        "person_id": assignment.person_id,
    }


def _assignment_for_update(*, tenant: Tenant, assignment_id: uuid.UUID) -> Assignment:
    portal_db.require_transaction()
    try:
        return Assignment.objects.select_for_update(of=("self",)).get(
            tenant=tenant, pk=assignment_id
        )
    except Assignment.DoesNotExist:
        raise AssignmentNotFound(assignment_id=str(assignment_id)) from None


def _open_for_update(*, tenant: Tenant, assignment_id: uuid.UUID) -> Assignment:
    assignment = _assignment_for_update(tenant=tenant, assignment_id=assignment_id)
    if assignment.closed_at is not None:
        raise ItemClosed(assignment_id=str(assignment_id))
    return assignment


@transaction.atomic(durable=True)
def item_reassign(
    *,
    tenant: Tenant,
    assignment_id: uuid.UUID,
    group_id: uuid.UUID,
    user: Person,
    person_id: int | None = None,
) -> Assignment:
    """Move an item to another group of the tenant, or to a person in one
    (support or admin only).

    The SLA clock keeps running. One ``desk.item_reassigned`` event names the
    person who moved it, the groups and people before and after; the new group is
    notified, or, when the item goes to a person, that person alone (and the
    tenant's webhooks either way). Moving it to where it is changes nothing and
    writes nothing.

    Raises:
        PermissionDenied: the user may not work this tenant's desk.
        AssignmentNotFound: no such item in the tenant.
        ItemClosed: the item is done.
        NotFound: no such group in the tenant.
        AssigneeNotAllowed: the person is not in the group or may not work the
            desk.
    """
    _require_desk_role(tenant=tenant, user=user)
    assignment = _open_for_update(tenant=tenant, assignment_id=assignment_id)
    group = Group.objects.filter(tenant=tenant, pk=group_id).first()
    if group is None:
        raise NotFound("No such group in this tenant.", group_id=str(group_id))
    person = None
    if person_id is not None:
        person = User.objects.filter(pk=person_id, is_active=True).first()
        if (
            person is None
            or not selectors.group_has_member(
                tenant=tenant, group_ids=[group.pk], user_id=person_id
            )
            or not has_tenant_perm(
                user=person, tenant=tenant, perm=TenantPerm.WORK_TAKEOVER
            )
        ):
            raise AssigneeNotAllowed(group_id=str(group.pk), person_id=person_id)
    before_group, before_person = assignment.group_id, assignment.person_id
    if (before_group, before_person) == (group.pk, person_id):
        return assignment
    assignment.group_id, assignment.person = group.pk, person
    assignment.save(update_fields=["group", "person"])
    event_id = audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.DESK_ITEM_REASSIGNED,
        actor=Actor.of_user(user),
        task_id=assignment.task_id,
        data=payloads.DeskItemReassigned(
            {
                **_item(assignment),
                "from_group_id": str(before_group),
                "from_person_id": before_person,
            }
        ),
    )
    _notify(
        tenant=tenant,
        event_id=event_id,
        code=EventCode.DESK_ITEM_REASSIGNED,
        assignment=assignment,
    )
    return assignment


@transaction.atomic(durable=True)
def item_take_over(
    *, tenant: Tenant, assignment_id: uuid.UUID, user: Person
) -> Assignment:
    """The person takes the item: they become its assignee (audited).

    Only a member of the item's group may take it (support or admin role too).
    Taking one's own item again changes nothing and writes nothing.

    Raises:
        PermissionDenied: the user may not work this tenant's desk.
        NotAGroupMember: the user is not in the item's group.
        AssignmentNotFound: no such item in the tenant.
        ItemClosed: the item is done.
    """
    _require_desk_role(tenant=tenant, user=user)
    assignment = _open_for_update(tenant=tenant, assignment_id=assignment_id)
    if not selectors.group_has_member(
        tenant=tenant, group_ids=[assignment.group_id], user_id=user.pk or 0
    ):
        raise NotAGroupMember(assignment_id=str(assignment_id))
    if assignment.person_id == user.pk:
        return assignment
    before_person = assignment.person_id
    assignment.person = user  # type: ignore[assignment]
    assignment.save(update_fields=["person"])
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.DESK_ITEM_REASSIGNED,
        actor=Actor.of_user(user),
        task_id=assignment.task_id,
        data=payloads.DeskItemReassigned(
            {**_item(assignment), "taken_over": True, "from_person_id": before_person}
        ),
    )
    return assignment


def _require_desk_role(*, tenant: Tenant, user: Person) -> None:
    if not has_tenant_perm(user=user, tenant=tenant, perm=TenantPerm.WORK_TAKEOVER):
        raise PermissionDenied("work_takeover is needed to move desk items")


# --- The SLA clock ------------------------------------------------------------------

# An escalation is done when its app says so: routing reads the item's table by name
# (no import of tasks, docs/style.md R1), as audit names tasks by id.
_CLOSE_RESOLVED: Final = """
UPDATE routing_assignment a SET closed_at = e.resolved_at
FROM tasks_escalation e
WHERE a.item_kind = 'desk.escalation' AND a.closed_at IS NULL
  AND e.tenant_id = a.tenant_id AND e.id = a.item_id AND e.resolved_at IS NOT NULL
"""
# An approval is done once it no longer waits for people (approved, rejected,
# expired, superseded: tasks_approval's states).
_CLOSE_DECIDED: Final = """
UPDATE routing_assignment a SET closed_at = coalesce(p.decided_at, app_now())
FROM tasks_approval p
WHERE a.item_kind = 'approval' AND a.closed_at IS NULL
  AND p.tenant_id = a.tenant_id AND p.id = a.item_id AND p.state <> 'waiting'
"""


@scope.in_tenants_with("routing_tenants_with_due_work")
@transaction.atomic(durable=True)
def sla_sweep(*, limit: int = 200) -> tuple[int, int]:
    """Remind and escalate open items past their deadlines; (reminded, escalated).

    Guarantee: each item is reminded at most once and escalated at most once (the
    ``reminded_at``/``escalated_at`` marks, set under ``FOR UPDATE SKIP LOCKED`` so
    concurrent sweeps split the rows). Reminders go to the item's group; an escalation
    moves the item to the rule's backup group (if any), counts a breach in
    ``portal_sla_breaches_total`` and notifies the group it is in now. Items that
    are done first close (an escalation resolved, an approval no longer waiting),
    so they are neither reminded nor escalated. Deadlines are measured on
    ``app_now()``.
    """
    with connection.cursor() as cursor:
        cursor.execute(_CLOSE_RESOLVED)
        cursor.execute(_CLOSE_DECIDED)
    now = portal_db.db_now()
    open_items = Assignment.objects.select_for_update(
        of=("self",), skip_locked=True
    ).filter(closed_at__isnull=True, escalated_at__isnull=True)
    escalated = 0
    for assignment in open_items.filter(escalate_at__lte=now).order_by("pk")[:limit]:
        _escalate(assignment=assignment, now=now)
        escalated += 1
    reminded = 0
    for assignment in open_items.filter(
        remind_at__lte=now, reminded_at__isnull=True
    ).order_by("pk")[:limit]:
        _remind(assignment=assignment, now=now)
        reminded += 1
    return reminded, escalated


# The groups an approval's policy names (any of them may decide), read by name like
# the closing statements above.
_APPROVAL_GROUPS: Final = """
SELECT jsonb_array_elements_text(p.groups)
FROM tasks_approval p WHERE p.tenant_id = %s AND p.id = %s
"""


def _deciding_group_ids(*, assignment: Assignment) -> list[uuid.UUID]:
    """For an approval, the ids of the tenant's groups its policy names; else []."""
    if assignment.item_kind != ItemKind.APPROVAL:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_APPROVAL_GROUPS, [assignment.tenant_id, assignment.item_id])
        names = [name for (name,) in cursor.fetchall()]
    return selectors.group_ids_named(tenant=assignment.tenant, names=names)


def _remind(*, assignment: Assignment, now: dt.datetime) -> None:
    tenant = assignment.tenant
    assignment.reminded_at = now
    assignment.save(update_fields=["reminded_at"])
    event_id = audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.DESK_ITEM_REMINDED,
        actor=SLA,
        task_id=assignment.task_id,
        reason=assignment.reason_code or None,
        data=_item(assignment),
    )
    _notify(
        tenant=tenant,
        event_id=event_id,
        code=EventCode.DESK_ITEM_REMINDED,
        assignment=assignment,
        also_group_ids=_deciding_group_ids(assignment=assignment),
    )


def _escalate(*, assignment: Assignment, now: dt.datetime) -> None:
    tenant = assignment.tenant
    rule = selectors.rule_for(tenant=tenant, reason_code=assignment.reason_code)
    before = assignment.group_id
    if rule is not None and rule.backup_group_id is not None:
        assignment.group_id, assignment.person = rule.backup_group_id, None
    assignment.escalated_at = now
    if assignment.reminded_at is None:  # escalating says more than a reminder would
        assignment.reminded_at = now
    assignment.save(update_fields=["group", "person", "escalated_at", "reminded_at"])
    event_id = audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.DESK_ITEM_ESCALATED,
        actor=SLA,
        task_id=assignment.task_id,
        reason=assignment.reason_code or None,
        data=payloads.DeskItemEscalated(
            {**_item(assignment), "from_group_id": str(before)}
        ),
    )
    _notify(
        tenant=tenant,
        event_id=event_id,
        code=EventCode.DESK_ITEM_ESCALATED,
        assignment=assignment,
    )
    metrics.sla_breach_counted(reason_code=assignment.reason_code)


def group_member_add(
    *, tenant: Tenant, group: Group, user: Person, email_enabled: bool = True
) -> GroupMember:
    """Put a person in a group (the admin's and the tests' way in)."""
    member, _ = GroupMember.objects.update_or_create(
        tenant=tenant,
        group=group,
        user=user,
        defaults={"email_enabled": email_enabled},
    )
    return member


@transaction.atomic(durable=True)
def member_email_choose(
    *, tenant: Tenant, member_id: uuid.UUID, user: Person, email_enabled: bool
) -> GroupMember:
    """A person's own choice for the e-mail channel: one group's items by e-mail or
    not (webhooks are the group's channel, not a person's).

    The member themself (any role that reads the tenant) or a tenant administrator
    chooses. One ``tenant.changed`` event names the person and the row; the same
    choice again writes nothing. New notifications follow the choice, and delivery
    reads it again before sending (``routing.delivery``).

    Raises:
        NotFound: no such member row in the tenant.
        PermissionDenied: someone else's row, and the user is not an administrator.
    """
    member = (
        GroupMember.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, pk=member_id)
        .first()
    )
    if member is None:
        raise NotFound("No such group member in this tenant.", member_id=str(member_id))
    own = member.user_id == user.pk and has_tenant_perm(
        user=user, tenant=tenant, perm=TenantPerm.VIEW_TRAIL
    )
    if not own:
        _require_admin(tenant=tenant, user=user)
    if member.email_enabled == email_enabled:
        return member
    member.email_enabled = email_enabled
    member.save(update_fields=["email_enabled"])
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TENANT_CHANGED,
        actor=Actor.of_user(user),
        data=payloads.TenantChanged(
            {
                "routing": "groupmember",
                "id": str(member.pk),
                "change": "email_enabled" if email_enabled else "email_disabled",
            }
        ),
    )
    return member


# --- The tenant administrator's set-up (console/admin/routing.py) -------------------

SetupRow = Group | GroupMember | RoutingRule | Webhook


def _require_admin(*, tenant: Tenant, user: Person) -> None:
    if not has_tenant_perm(user=user, tenant=tenant, perm=TenantPerm.MANAGE_TENANT):
        raise PermissionDenied("manage_tenant is needed to change routing")


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def setup_save(*, tenant: Tenant, row: SetupRow, user: Person) -> SetupRow:
    """Save a group, member, rule or webhook of the tenant; one ``tenant.changed``
    event names the person and the row (ids and kinds only).

    Raises:
        PermissionDenied: the user is not an administrator of the tenant.
        IntegrityError: a constraint refused the row (e.g. a group of another
            tenant, a reminder not before the escalation).
    """
    _require_admin(tenant=tenant, user=user)
    created = row._state.adding
    row.tenant = tenant
    row.save()
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TENANT_CHANGED,
        actor=Actor.of_user(user),
        data=payloads.TenantChanged(
            {
                "routing": row._meta.model_name,
                "id": str(row.pk),
                "change": "created" if created else "changed",
            }
        ),
    )
    return row


@transaction.atomic(durable=True)
def setup_delete(*, tenant: Tenant, row: SetupRow, user: Person) -> None:
    """Delete a group, member, rule or webhook of the tenant (audited like
    ``setup_save``).

    Raises:
        PermissionDenied: the user is not an administrator of the tenant.
        SetupRowInUse: a group still named by a rule or an assignment.
    """
    _require_admin(tenant=tenant, user=user)
    kind, pk = row._meta.model_name, str(row.pk)
    try:
        row.delete()
    except ProtectedError:
        raise SetupRowInUse(row=pk) from None
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TENANT_CHANGED,
        actor=Actor.of_user(user),
        data=payloads.TenantChanged({"routing": kind, "id": pk, "change": "deleted"}),
    )
