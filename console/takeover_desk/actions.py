"""The desk's buttons: thin wrappers over the takeover and routing services.

:func:`desk_claim`, :func:`desk_release`, :func:`desk_resolve` and
:func:`desk_edit` check ``TenantPerm.WORK_TAKEOVER`` on the task's tenant
(portal/roles.py) and then call the services in ``tasks.takeover`` unchanged, with
the person as the actor; those services check the membership again and write the
events. :func:`desk_take_over` and :func:`desk_reassign` do the same for the
task's routed desk item (``routing.services.item_take_over`` / ``item_reassign``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from portal.exceptions import ValidationFailed
from portal.models import Membership, TenantPerm
from portal.roles import ROLE_PERMISSIONS, Person, require_tenant_perm
from routing import selectors as routing_selectors
from routing import services as routing_services
from routing.exceptions import AssignmentNotFound
from routing.models import Assignment
from tasks import takeover
from tasks.gateway import FieldValue
from tasks.models import Task


def _require_takeover(*, task: Task, user: Person) -> None:
    require_tenant_perm(user=user, perm=TenantPerm.WORK_TAKEOVER, tenant=task.tenant)


def desk_claim(*, task: Task, user: Person) -> Task:
    """Claim from the desk: the role check, then ``takeover.task_human_claim``.

    Raises:
        PermissionDenied, TenantNotVisible: no ``work_takeover`` on the tenant.
        AlreadyClaimed, IllegalTransition, TaskNotFound: from the service.
    """
    _require_takeover(task=task, user=user)
    return takeover.task_human_claim(task=task, user=user)


def desk_release(*, task: Task, user: Person) -> Task:
    """Release one's own claim (``takeover.task_human_release``).

    Raises:
        PermissionDenied, TenantNotVisible: no ``work_takeover`` on the tenant.
        NotYourClaim, IllegalTransition, TaskNotFound: from the service.
    """
    _require_takeover(task=task, user=user)
    return takeover.task_human_release(task=task, user=user)


def desk_resolve(
    *,
    task: Task,
    user: Person,
    resolution: str,
    operation_id: uuid.UUID | None = None,
    provider_reference: str | None = None,
    note: str = "",
) -> takeover.ResolutionOutcome:
    """Settle one's claim (``takeover.task_human_resolve``).

    Raises:
        PermissionDenied, TenantNotVisible: no ``work_takeover`` on the tenant.
        NotYourClaim, IllegalTransition, ValidationFailed, OperationNotFound,
            TaskNotFound: from the service.
    """
    _require_takeover(task=task, user=user)
    return takeover.task_human_resolve(
        task=task,
        user=user,
        resolution=resolution,
        operation_id=operation_id,
        provider_reference=provider_reference or None,
        note=note,
    )


def desk_release_any(*, task: Task, user: Person, note: str) -> Task:
    """Release another person's claim (tenant admins), e.g. one left overnight.

    Raises:
        PermissionDenied, TenantNotVisible: no ``release_any_claim`` on the tenant.
        IllegalTransition: the task is not claimed.
    """
    require_tenant_perm(
        user=user, perm=TenantPerm.RELEASE_ANY_CLAIM, tenant=task.tenant
    )
    return takeover.task_human_release(task=task, user=user, note=note)


# --- who has the item: take over and reassign (routing/) ---------------------------


@dataclass(frozen=True, kw_only=True)
class DeskRouting:
    """The item page's routing box: who may take the item and where it may go."""

    assignment: Assignment
    can_take_over: bool
    targets: list[routing_selectors.ReassignTarget]


def _desk_people(*, tenant_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, set[int]]:
    """Each tenant's active members whose role works the desk (``work_takeover``),
    in one query."""
    roles = [
        r for r, perms in ROLE_PERMISSIONS.items() if TenantPerm.WORK_TAKEOVER in perms
    ]
    people: dict[uuid.UUID, set[int]] = {}
    for tenant_id, user_id in Membership.objects.filter(
        tenant_id__in=list(tenant_ids), role__in=roles, user__is_active=True
    ).values_list("tenant_id", "user_id"):
        people.setdefault(tenant_id, set()).add(user_id)
    return people


def desk_list_targets(
    *, tenant_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, list[routing_selectors.ReassignTarget]]:
    """Where the desk's list may move its rows' items, by tenant: the tenants'
    groups and their members who work the desk, in three queries for the whole
    page (the caller shows them only on rows the person may act on)."""
    tenants = set(tenant_ids)
    return routing_selectors.reassign_targets_of_tenants(
        tenant_ids=tenants, people=_desk_people(tenant_ids=tenants)
    )


def desk_routing(*, task: Task, user: Person) -> DeskRouting | None:
    """The routing box of a task's open desk item for a person who may act on it
    (the caller checked ``work_takeover``); None when the item is not routed or is
    closed. Take over is offered to members of the item's group who do not hold it;
    reassign offers the tenant's groups and their members who work the desk."""
    assignment = routing_selectors.assignment_of_task(
        tenant=task.tenant, task_id=task.pk
    )
    if assignment is None or assignment.closed_at is not None:
        return None
    return DeskRouting(
        assignment=assignment,
        can_take_over=assignment.person_id != user.pk
        and routing_selectors.group_has_member(
            tenant=task.tenant, group_ids=[assignment.group_id], user_id=user.pk or 0
        ),
        targets=routing_selectors.reassign_targets(
            tenant=task.tenant,
            people=_desk_people(tenant_ids=[task.tenant_id]).get(task.tenant_id, ()),
        ),
    )


def _open_assignment(*, task: Task) -> Assignment:
    assignment = routing_selectors.assignment_of_task(
        tenant=task.tenant, task_id=task.pk
    )
    if assignment is None:
        raise AssignmentNotFound("This task's desk item is not routed.")
    return assignment


def desk_take_over(*, task: Task, user: Person) -> Assignment:
    """Take the task's desk item (``routing.services.item_take_over``).

    Raises:
        PermissionDenied, TenantNotVisible: no ``work_takeover`` on the tenant.
        AssignmentNotFound, ItemClosed, NotAGroupMember: from the service.
    """
    _require_takeover(task=task, user=user)
    assignment = _open_assignment(task=task)
    return routing_services.item_take_over(
        tenant=task.tenant, assignment_id=assignment.pk, user=user
    )


def desk_reassign(*, task: Task, user: Person, to: str) -> Assignment:
    """Move the task's desk item to a group or a person in one
    (``routing.services.item_reassign``); ``to`` is a ``ReassignTarget.value``.

    Raises:
        PermissionDenied, TenantNotVisible: no ``work_takeover`` on the tenant.
        ValidationFailed: ``to`` is not a group or a group and a person.
        AssignmentNotFound, ItemClosed, NotFound, AssigneeNotAllowed: from the
            service.
    """
    _require_takeover(task=task, user=user)
    group, _, person = to.strip().partition(":")
    try:
        group_id = uuid.UUID(group)
        person_id = int(person) if person else None
    except ValueError:
        raise ValidationFailed(
            "Choose a group or a person to move the item to.", field="to"
        ) from None
    assignment = _open_assignment(task=task)
    return routing_services.item_reassign(
        tenant=task.tenant,
        assignment_id=assignment.pk,
        group_id=group_id,
        person_id=person_id,
        user=user,
    )


def desk_edit(
    *,
    task: Task,
    user: Person,
    operation_id: uuid.UUID,
    fields: Sequence[FieldValue],
    note: str = "",
) -> takeover.EditOutcome:
    """Execute with the values a person gives (``takeover.task_human_edit``).

    No transaction may be open: the gateway calls the remote system. The caller
    (a plain admin view, ``ATOMIC_REQUESTS`` off) opens none.

    Raises:
        PermissionDenied, TenantNotVisible: no ``work_takeover`` on the tenant.
        NotYourClaim, IllegalTransition, OperationNotFound, ValidationFailed,
            TaskNotFound, LeaseExpired: from the service and the gateway.
    """
    _require_takeover(task=task, user=user)
    return takeover.task_human_edit(
        task=task, user=user, operation_id=operation_id, fields=fields, note=note
    )
