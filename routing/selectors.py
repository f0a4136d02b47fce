"""Reads of routing: the desk's assignments and their SLA clocks."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from django.db import connection
from django.db.models import QuerySet

from portal.models import Tenant

from .models import Assignment, Group, GroupMember, ItemKind, RoutingRule, Webhook


def rule_for(*, tenant: Tenant, reason_code: str) -> RoutingRule | None:
    """The reason code's rule, else the tenant's default rule (empty code), or None."""
    rules = {
        rule.reason_code: rule
        for rule in RoutingRule.objects.filter(
            tenant=tenant, reason_code__in=[reason_code, ""]
        )
    }
    return rules.get(reason_code) or rules.get("")


def group_members(
    *, tenant: Tenant, group_ids: Iterable[uuid.UUID]
) -> QuerySet[GroupMember]:
    """The members of these groups of the tenant, with their users (one query)."""
    return GroupMember.objects.filter(
        tenant=tenant, group_id__in=list(group_ids)
    ).select_related("user")


def group_ids_named(*, tenant: Tenant, names: Iterable[str]) -> list[uuid.UUID]:
    """The ids of the tenant's groups with these names, in the names' order; a
    name the tenant has no group of is left out."""
    wanted = [name for name in names if name]
    ids = dict(
        Group.objects.filter(tenant=tenant, name__in=wanted).values_list("name", "pk")
    )
    return [ids[name] for name in dict.fromkeys(wanted) if name in ids]


@dataclass(frozen=True, kw_only=True)
class ReassignTarget:
    """Where the desk may move an item: a group, or a person in it."""

    group_id: uuid.UUID
    group: str
    user_id: int | None = None
    person: str = ""

    @property
    def value(self) -> str:
        """The form's value: ``<group id>`` or ``<group id>:<user id>``."""
        return f"{self.group_id}:{self.user_id}" if self.user_id else str(self.group_id)

    @property
    def label(self) -> str:
        return f"{self.group} \u2192 {self.person}" if self.user_id else self.group


def reassign_targets(
    *, tenant: Tenant, people: Iterable[int] | None = None
) -> list[ReassignTarget]:
    """The tenant's groups by name, each followed by its members by username (two
    queries). ``people``, when given, keeps to those user ids (those who may work
    the desk); a group is offered even without any."""
    return reassign_targets_of_tenants(
        tenant_ids=[tenant.pk],
        people=None if people is None else {tenant.pk: people},
    ).get(tenant.pk, [])


def reassign_targets_of_tenants(
    *,
    tenant_ids: Iterable[uuid.UUID],
    people: Mapping[uuid.UUID, Iterable[int]] | None = None,
) -> dict[uuid.UUID, list[ReassignTarget]]:
    """``reassign_targets`` of several tenants at once, by tenant id, in two queries
    whatever their number (the desk's list offers them on every row). ``people``,
    when given, keeps each tenant's members to its user ids; a tenant missing from
    it offers its groups only."""
    tenants = list(tenant_ids)
    allowed = (
        None
        if people is None
        else {tenant_id: set(users) for tenant_id, users in people.items()}
    )
    groups = list(Group.objects.filter(tenant_id__in=tenants).order_by("name", "id"))
    members: dict[uuid.UUID, list[GroupMember]] = {}
    for member in (
        GroupMember.objects.filter(tenant_id__in=tenants)
        .select_related("user")
        .order_by("user__username")
    ):
        if allowed is None or member.user_id in allowed.get(member.tenant_id, ()):
            members.setdefault(member.group_id, []).append(member)
    targets: dict[uuid.UUID, list[ReassignTarget]] = {t: [] for t in tenants}
    for group in groups:
        of_tenant = targets.setdefault(group.tenant_id, [])
        of_tenant.append(ReassignTarget(group_id=group.pk, group=group.name))
        of_tenant.extend(
            ReassignTarget(
                group_id=group.pk,
                group=group.name,
                user_id=member.user_id,
                person=member.user.get_username(),
            )
            for member in members.get(group.pk, [])
        )
    return targets


def group_has_member(
    *, tenant: Tenant, group_ids: Iterable[uuid.UUID], user_id: int
) -> bool:
    return GroupMember.objects.filter(
        tenant=tenant, group_id__in=list(group_ids), user_id=user_id
    ).exists()


def webhooks_enabled(*, tenant: Tenant) -> QuerySet[Webhook]:
    return Webhook.objects.filter(tenant=tenant, enabled=True).order_by("id")


def assignment_of_task(*, tenant: Tenant, task_id: uuid.UUID) -> Assignment | None:
    """The latest escalation assignment of a task (a task escalated twice has two)."""
    return (
        Assignment.objects.filter(
            tenant=tenant, item_kind=ItemKind.ESCALATION, task_id=task_id
        )
        .select_related("person")
        .order_by("-assigned_at")
        .first()
    )


@dataclass(frozen=True, kw_only=True)
class SlaClock:
    """An item's deadline as a person reads it."""

    group: str
    person: str
    due_at: dt.datetime
    seconds_left: int  # negative: overdue
    reminded: bool
    escalated: bool
    closed: bool
    # Who has it, by id: the desk marks the current choice among reassign targets.
    group_id: uuid.UUID | None = None
    person_id: int | None = None

    @property
    def overdue(self) -> bool:
        return self.seconds_left < 0 and not self.closed

    @property
    def text(self) -> str:
        """Reads "due in 12 min", "overdue by 5 min", or "closed"."""
        if self.closed:
            return "closed"
        seconds = abs(self.seconds_left)
        minutes = round(seconds / 60)
        if seconds < 60:
            span = f"{seconds} s"
        elif minutes < 120:
            span = f"{minutes} min"
        else:
            span = f"{round(minutes / 60)} h"
        return f"overdue by {span}" if self.overdue else f"due in {span}"

    @property
    def label(self) -> str:
        """Reads "Billing: due in 12 min" or "On-call: overdue by 5 min (reminded,
        escalated)": the desk's and the approvals page's cell."""
        marks = f" ({self.marks})" if self.marks else ""
        return f"{self.group}: {self.text}{marks}"

    @property
    def marks(self) -> str:
        return ", ".join(
            mark
            for mark, on in (("reminded", self.reminded), ("escalated", self.escalated))
            if on
        )


def sla_clocks_of_tasks(
    *, task_ids: Sequence[uuid.UUID], tenant_ids: Iterable[uuid.UUID], now: dt.datetime
) -> dict[uuid.UUID, SlaClock]:
    """The latest escalation assignment's clock of each task, by task id (two
    queries, whatever the number of tasks)."""
    tenants = list(tenant_ids)
    assignments: dict[uuid.UUID, Assignment] = {}
    for assignment in (
        Assignment.objects.filter(
            tenant_id__in=tenants,
            item_kind=ItemKind.ESCALATION,
            task_id__in=list(task_ids),
        )
        .select_related("person")
        .order_by("assigned_at")
    ):
        assert assignment.task_id is not None
        assignments[assignment.task_id] = assignment  # the latest wins
    groups = dict(
        Group.objects.filter(
            tenant_id__in=tenants, pk__in={a.group_id for a in assignments.values()}
        ).values_list("pk", "name")
    )
    return {
        task_id: _clock(assignment, group=groups.get(assignment.group_id, ""), now=now)
        for task_id, assignment in assignments.items()
    }


def sla_clocks_of_items(
    *,
    item_kind: ItemKind,
    item_ids: Sequence[uuid.UUID],
    tenant_ids: Iterable[uuid.UUID],
    now: dt.datetime,
) -> dict[uuid.UUID, SlaClock]:
    """The clock of each item of a kind, by item id (two queries, whatever the
    number of items)."""
    tenants = list(tenant_ids)
    assignments = list(
        Assignment.objects.filter(
            tenant_id__in=tenants, item_kind=item_kind, item_id__in=list(item_ids)
        ).select_related("person")
    )
    groups = dict(
        Group.objects.filter(
            tenant_id__in=tenants, pk__in={a.group_id for a in assignments}
        ).values_list("pk", "name")
    )
    return {
        a.item_id: _clock(a, group=groups.get(a.group_id, ""), now=now)
        for a in assignments
    }


def _clock(assignment: Assignment, *, group: str, now: dt.datetime) -> SlaClock:
    return SlaClock(
        group=group,
        person=assignment.person.get_username() if assignment.person else "",
        due_at=assignment.escalate_at,
        seconds_left=int((assignment.escalate_at - now).total_seconds()),
        reminded=assignment.reminded_at is not None,
        escalated=assignment.escalated_at is not None,
        closed=assignment.closed_at is not None,
        group_id=assignment.group_id,
        person_id=assignment.person_id,
    )


def sla_clock(*, assignment: Assignment, now: dt.datetime) -> SlaClock:
    """The clock of one assignment at ``now`` (the database clock, ``app_now()``).

    Before the escalation the item is due at ``escalate_at``; once escalated it has
    no later deadline and shows how long it is overdue.
    """
    group = (
        Group.objects.filter(tenant_id=assignment.tenant_id, pk=assignment.group_id)
        .values_list("name", flat=True)
        .first()
    )
    return _clock(assignment, group=group or "", now=now)


# Per tenant, a capped range of routing_assignment_due_idx (tenant, escalate_at).
_OVERDUE = """
SELECT t.id, (SELECT count(*) FROM (
    SELECT 1 FROM routing_assignment a
    WHERE a.tenant_id = t.id AND a.closed_at IS NULL AND a.escalate_at <= app_now()
    LIMIT %(cap)s + 1) capped)
FROM unnest(%(tenants)s::uuid[]) AS t(id)
"""


def overdue_counts(
    *, tenant_ids: Sequence[uuid.UUID], cap: int
) -> dict[uuid.UUID, int]:
    """Open items past their SLA deadline (``app_now()``) per tenant, counted up to
    ``cap + 1``: the dashboard's figure, one statement whatever the tenants."""
    if not tenant_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_OVERDUE, {"tenants": list(tenant_ids), "cap": cap})
        return dict(cursor.fetchall())
