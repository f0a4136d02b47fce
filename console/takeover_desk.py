"""The takeover desk's reads and its thin wrappers over the takeover services.

Reads: a keyset page of the queue (newest or oldest first, "next" from the last
row's ``(updated_at, id)``, never OFFSET and never a COUNT of the table), the
evidence a person needs to decide, and display names for the owners stored as
``user:<id>`` or an agent's id.

Writes: :func:`desk_claim`, :func:`desk_release`, :func:`desk_resolve` and
:func:`desk_edit` check ``TenantPerm.WORK_TAKEOVER`` on the task's tenant
(portal/roles.py) and then call the services in ``tasks.takeover`` unchanged, with
the person as the actor; those services check the membership again and write the
events. :func:`desk_take_over` and :func:`desk_reassign` do the same for the
task's routed desk item (``routing.services.item_take_over`` / ``item_reassign``).

The resolve and edit forms: which resolutions a task offers (approve only where
``takeover.APPROVABLE_REASONS`` allows it), their labels and help, the rows of the
edit form (the pinned contract's required fields) and the sentence that reports
what an edit came to.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.exceptions import InvalidTag

from audit.models import Event
from audit.redaction import redact
from portal.actor_names import ActorNames
from portal.actors import ActorType
from portal.codes import ReasonCode
from portal.db import db_now
from portal.exceptions import PortalError, ValidationFailed
from portal.models import Membership, TenantPerm
from portal.roles import ROLE_PERMISSIONS, Person, require_tenant_perm
from routing import selectors as routing_selectors
from routing import services as routing_services
from routing.exceptions import AssignmentNotFound
from routing.models import Assignment
from tasks import takeover
from tasks.contracts import contract_sensitive_fields
from tasks.gateway import FieldValue
from tasks.gateway.checks import field_problems
from tasks.models import (
    Contract,
    Escalation,
    ObjectVersion,
    Operation,
    OperationState,
    Task,
)
from tasks.sealed import operation_given_fields

from .story import event_rows, is_live

EVENTS_SHOWN: Final = 50


# --- names ---------------------------------------------------------------------------


def owner_names(
    owners: Iterable[str | None], *, tenant_ids: Iterable[uuid.UUID] = ()
) -> dict[str, str]:
    """Display names for lease and escalation owners, in two queries at most.

    ``user:<pk>`` becomes the username, an agent's id (bare or ``agent:<id>``)
    ``agent <name>`` when the agent belongs to one of ``tenant_ids``; anything else
    (a worker's own name) is shown as it is.
    """
    parsed = {
        owner: ActorNames.split_owner(owner) for owner in {o for o in owners if o}
    }
    names = ActorNames(
        [pair for pair in parsed.values() if pair[0]], tenant_ids=tenant_ids
    )
    shown: dict[str, str] = {}
    for owner, (kind, rest) in parsed.items():
        name = names.name(kind, rest) if kind else None
        if name is not None:
            shown[owner] = f"agent {name}" if kind == ActorType.AGENT else name
    return shown


def human_age(delta: dt.timedelta) -> str:
    """``12 min``, ``3 h 5 min``, ``2 d 4 h``: how long a task has waited."""
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


# --- the evidence panel ----------------------------------------------------------


def _pretty(value: Any) -> str:
    """JSON for a ``<pre>`` block (the caller passes redacted data)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@dataclass(frozen=True, kw_only=True)
class OperationEvidence:
    operation: Operation
    call_fields: dict[str, Any] | None  # redacted
    input: dict[str, Any]  # redacted

    @property
    def call_fields_json(self) -> str:
        return (
            "not fixed yet" if self.call_fields is None else _pretty(self.call_fields)
        )

    @property
    def input_json(self) -> str:
        return _pretty(self.input)


@dataclass(frozen=True, kw_only=True)
class DeskEvidence:
    """What a person reads before deciding, all of it redacted for display."""

    escalation: Escalation | None
    escalations: list[Escalation]
    plan: dict[str, Any] | None
    version_read: str
    current_version: str | None
    conflicting_fields: list[Any]
    receipts: list[Any]
    evidence: dict[str, Any]
    operations: list[OperationEvidence]
    # The task's latest events, oldest first, as the story shows them
    # (story.event_rows); ``more_events``: older ones are in the event browser.
    timeline: list[dict[str, Any]]
    more_events: bool = False
    # The task may still change: the page refreshes its timeline (story-live.js).
    live: bool = False
    names: dict[str, str] = field(default_factory=dict)
    # Who has the item and its SLA clock (routing/), when it was routed.
    sla: routing_selectors.SlaClock | None = None

    @property
    def responsible(self) -> str:
        """The open (else latest) escalation's responsible owner, by name."""
        owner = self.escalation.responsible_owner if self.escalation else ""
        return self.names.get(owner, owner) if owner else "—"

    @property
    def settled_as(self) -> str:
        """What the person did with the escalation: its label and recorded code."""
        code = self.escalation.resolution if self.escalation else ""
        return f"{resolution_label(code)} ({code})" if code else "resolved"

    @property
    def version_differs(self) -> bool:
        return self.current_version != self.version_read

    @property
    def evidence_json(self) -> str:
        return _pretty(self.evidence)

    @property
    def plan_json(self) -> str:
        return _pretty(self.plan)


def desk_evidence(*, task: Task) -> DeskEvidence:
    """The evidence panel of one task (the caller has checked it may read it).

    The open escalation (else the latest) supplies the plan, conflicting fields and
    receipts; the current object version is read live; operations show their call
    fields and input through ``redact`` again (they are stored redacted already);
    the task's events come with their actors' names. A fixed number of queries,
    whatever the task holds.
    """
    escalations = list(
        Escalation.objects.filter(tenant_id=task.tenant_id, task_id=task.pk)
        .select_related("resolved_by")
        .order_by("-created_at", "-id")
    )
    escalation = next((e for e in escalations if e.resolved_at is None), None)
    if escalation is None and escalations:
        escalation = escalations[0]
    evidence = redact(
        escalation.evidence if escalation else {}, tenant_id=task.tenant_id
    )
    plan = evidence.get("plan") if isinstance(evidence.get("plan"), dict) else None
    current = (
        ObjectVersion.objects.filter(
            tenant_id=task.tenant_id,
            object_type=task.object_type,
            object_id=task.object_id,
        )
        .values_list("version", flat=True)
        .first()
    )
    receipts = list(evidence.get("receipts") or [])
    if evidence.get("answered") and evidence["answered"] not in receipts:
        receipts.insert(0, evidence["answered"])
    operations = [
        OperationEvidence(
            operation=operation,
            call_fields=(
                redact(operation.call_fields, tenant_id=task.tenant_id)
                if isinstance(operation.call_fields, dict)
                else None
            ),
            input=redact(
                operation.input if isinstance(operation.input, dict) else {},
                tenant_id=task.tenant_id,
            ),
        )
        for operation in Operation.objects.filter(
            tenant_id=task.tenant_id, task_id=task.pk
        ).order_by("created_at", "id")
    ]
    latest = list(
        Event.objects.filter(tenant_id=task.tenant_id, task_id=task.pk).order_by("-id")[
            : EVENTS_SHOWN + 1
        ]
    )
    events = latest[:EVENTS_SHOWN][::-1]  # the latest ones, oldest first
    names = owner_names(
        [task.lease_owner] + [e.responsible_owner for e in escalations],
        tenant_ids=[task.tenant_id],
    )
    timeline = event_rows(
        events,
        ActorNames(
            [(e.actor_type, e.actor_id) for e in events], tenant_ids=[task.tenant_id]
        ),
    )
    return DeskEvidence(
        escalation=escalation,
        escalations=escalations,
        plan=plan,
        version_read=task.object_version,
        current_version=current,
        conflicting_fields=list(evidence.get("conflicting_fields") or []),
        receipts=receipts,
        evidence=evidence,
        operations=operations,
        timeline=timeline,
        more_events=len(latest) > EVENTS_SHOWN,
        live=is_live(task),
        names=names,
        sla=desk_clock(task=task),
    )


def desk_clock(*, task: Task) -> routing_selectors.SlaClock | None:
    """The task's latest desk assignment and its SLA clock on ``app_now()``."""
    assignment = routing_selectors.assignment_of_task(
        tenant=task.tenant, task_id=task.pk
    )
    if assignment is None:
        return None
    return routing_selectors.sla_clock(assignment=assignment, now=db_now())


def desk_clocks(
    *, tasks: Sequence[Task]
) -> dict[uuid.UUID, routing_selectors.SlaClock]:
    """The SLA clocks of a page of tasks, by task id, in a fixed number of queries."""
    return routing_selectors.sla_clocks_of_tasks(
        task_ids=[task.pk for task in tasks],
        tenant_ids={task.tenant_id for task in tasks},
        now=db_now(),
    )


# --- the buttons ---------------------------------------------------------------------


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


# --- who has the item: take over and reassign (routing/) -----------------------------


@dataclass(frozen=True, kw_only=True)
class DeskRouting:
    """The item page's routing box: who may take the item and where it may go."""

    assignment: Assignment
    can_take_over: bool
    targets: list[routing_selectors.ReassignTarget]


def _desk_people(*, task: Task) -> list[int]:
    """The tenant's members whose role works the desk (``work_takeover``)."""
    roles = [
        r for r, perms in ROLE_PERMISSIONS.items() if TenantPerm.WORK_TAKEOVER in perms
    ]
    return list(
        Membership.objects.filter(
            tenant_id=task.tenant_id, role__in=roles, user__is_active=True
        ).values_list("user_id", flat=True)
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
            tenant=task.tenant, people=_desk_people(task=task)
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


# --- the resolve form ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ResolutionChoice:
    value: str
    label: str
    help: str


# The desk's order: the likely answers first. ``retry`` is the API's older name for
# approve and is not offered twice; ``edit`` is its own form (desk_edit).
RESOLUTION_CHOICES: Final[tuple[ResolutionChoice, ...]] = (
    ResolutionChoice(
        value="hand_back",
        label="Hand back for a fresh read",
        help="The agent reads the fields again and executes under the same key.",
    ),
    ResolutionChoice(
        value="verify",
        label="Verify: I found the receipt",
        help="Give the receipt id you found at the provider; nothing is called.",
    ),
    ResolutionChoice(
        value="approve",
        label="Approve as is",
        help="Run the same input once more, under the same key.",
    ),
    ResolutionChoice(
        value="cancel",
        label="Cancel",
        help="Nobody should do this any more; open operations fail.",
    ),
    ResolutionChoice(
        value="fail",
        label="Fail",
        help="It cannot be done; open operations fail and the task fails.",
    ),
    ResolutionChoice(
        value="complete",
        label="Complete",
        help="It is done (outside the portal); the task succeeds.",
    ),
)
EDIT_HELP: Final = (
    "You give a fresh value for each asked field, with its source and when you "
    "read it; a field whose value still passes is kept unless you give another. "
    "The gateway checks everything again and calls once, under the operation's "
    "own key. If it is verified, the task goes back to the agent; if not, it "
    "stays with you."
)
HAND_BACK_NOTE: Final = "what should the agent read again?"


def resolution_choices(*, task: Task) -> list[ResolutionChoice]:
    """The resolutions the desk offers for this task.

    ``approve`` only where the task's reason is in ``takeover.APPROVABLE_REASONS``:
    elsewhere the same input would be refused again (the service refuses it too).
    """
    return [
        choice
        for choice in RESOLUTION_CHOICES
        if choice.value != "approve" or task.reason_code in takeover.APPROVABLE_REASONS
    ]


def resolution_label(resolution: str) -> str:
    if resolution == takeover.EDITED_AND_EXECUTED:
        return "Edited the fields and executed"
    for choice in RESOLUTION_CHOICES:
        if choice.value == resolution:
            return choice.label
    return resolution.replace("_", " ")


# --- the edit form -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GivenField:
    """A value given at the operation's last refused execute, as the desk shows it:
    the value redacted (the contract's sensitive fields too), its source and read
    time. The real value stays sealed; an edit takes it from there, never the form."""

    shown: str
    source: str
    observed_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class EditRow:
    """One required field of the task's pinned contract, kept or asked.

    ``kept``: the value given last passes the field check now (right source, fresh
    enough), so the edit keeps it unless the person gives another. Otherwise the
    row is asked, and ``why`` says which check failed and what was read.
    """

    name: str
    source: str
    max_age_s: int
    given: GivenField | None = None
    kept: bool = False
    why: str = ""

    @property
    def max_age(self) -> str:
        return human_age(dt.timedelta(seconds=self.max_age_s))

    @property
    def kept_text(self) -> str:
        """A kept row's line: what is kept and until when it passes."""
        if not self.kept or self.given is None:
            return ""
        until = self.given.observed_at + dt.timedelta(seconds=self.max_age_s)
        return (
            f"{self.given.shown} from {self.given.source}, read at "
            f"{_when(self.given.observed_at)}; passes the fields check until "
            f"{_when(until)}. Leave it empty to keep it."
        )


def _when(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _asked_why(
    *,
    required: dict[str, Any],
    given: GivenField | None,
    refused: dict[str, Any] | None,
    now_problem: dict[str, Any] | None,
) -> str:
    """Why a row is asked: the check that refused it (the escalation's evidence),
    else what fails now (the value aged since), with the value read as redacted."""
    if given is None:
        return (
            "no value was given for it at the refused execute"
            if refused is None or refused.get("problem") == ReasonCode.FIELD_MISSING
            else "the value given is not kept; give it again"
        )
    read = f"read {given.shown} from {given.source} at {_when(given.observed_at)}"
    problem = refused or now_problem
    words = _problem_words(problem) if problem else None
    if refused is not None:
        return (
            f"the fields check refused it ({refused.get('problem')}): {words}; {read}"
        )
    if now_problem is not None and now_problem.get("problem") == ReasonCode.FIELD_STALE:
        return (
            f"it passed at the check but is now older than the contract allows "
            f"({human_age(dt.timedelta(seconds=int(required['max_age_s'])))}); {read}"
        )
    return f"{words or 'it does not pass the fields check now'}; {read}"


def desk_edit_rows(
    *, task: Task, operation: Operation | None = None
) -> list[EditRow] | None:
    """The edit form's rows: the pinned contract's ``required_fields``, in order.

    With ``operation``, each row knows the value given at its last refused execute
    (sealed with it) and whether that value passes the field check on the
    database's clock now: passing rows are kept, the others asked with the reason,
    taken from the open escalation's ``conflicting_fields`` where it names the field.

    None when the task pins no contract (there is nothing to check values against,
    and the gateway would refuse to execute).
    """
    if task.contract_key is None or task.contract_version is None:
        return None
    spec = (
        Contract.objects.filter(
            tenant_id=task.tenant_id,
            key=task.contract_key,
            version=task.contract_version,
        )
        .values_list("spec", flat=True)
        .first()
    )
    if not isinstance(spec, dict):
        return None
    required_fields = list(spec.get("required_fields") or [])
    given = _given_fields(operation=operation) if operation is not None else {}
    if not given:
        return [
            EditRow(
                name=str(required["name"]),
                source=str(required["source"]),
                max_age_s=int(required["max_age_s"]),
            )
            for required in required_fields
        ]
    _, problems = field_problems(
        spec={"required_fields": required_fields},
        fields=list(given.values()),
        now=db_now(),
    )
    failing = {str(problem["field"]): problem for problem in problems}
    refused = (
        _refused_fields(task=task, operation=operation) if operation is not None else {}
    )
    shown = redact(
        {name: field.value for name, field in given.items()},
        tenant_id=task.tenant_id,
        sensitive=contract_sensitive_fields(spec),
    )
    rows = []
    for required in required_fields:
        name = str(required["name"])
        value = given.get(name)
        seen = (
            GivenField(
                shown=_shown(shown.get(name)),
                source=value.source,
                observed_at=value.observed_at,
            )
            if value is not None
            else None
        )
        kept = name not in failing
        rows.append(
            EditRow(
                name=name,
                source=str(required["source"]),
                max_age_s=int(required["max_age_s"]),
                given=seen,
                kept=kept,
                why=""
                if kept
                else _asked_why(
                    required=required,
                    given=seen,
                    refused=refused.get(name),
                    now_problem=failing.get(name),
                ),
            )
        )
    return rows


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _given_fields(*, operation: Operation) -> dict[str, FieldValue]:
    """The fields sealed with the operation at its last refused execute, by name."""
    given: dict[str, FieldValue] = {}
    try:
        sealed_fields = operation_given_fields(operation)
    except (PortalError, InvalidTag, ValueError):
        # Not openable with this server secret: nothing is kept, every row asked.
        return given
    for item in sealed_fields:
        try:
            given[str(item["name"])] = FieldValue(
                name=str(item["name"]),
                value=item["value"],
                source=str(item["source"]),
                observed_at=dt.datetime.fromisoformat(str(item["observed_at"])),
            )
        except (KeyError, TypeError, ValueError):
            continue
    return given


def _refused_fields(*, task: Task, operation: Operation) -> dict[str, dict[str, Any]]:
    """The open escalation's ``conflicting_fields`` for this operation, by field."""
    evidence = (
        Escalation.objects.filter(
            tenant_id=task.tenant_id,
            task_id=task.pk,
            operation_id=operation.pk,
            resolved_at__isnull=True,
        )
        .order_by("-created_at", "-id")
        .values_list("evidence", flat=True)
        .first()
    )
    problems = (
        evidence.get("conflicting_fields") if isinstance(evidence, dict) else None
    )
    return {
        str(problem["field"]): problem
        for problem in problems or []
        if isinstance(problem, dict) and "field" in problem
    }


def edit_fields(
    *, rows: Sequence[EditRow], operation: Operation, given: Sequence[FieldValue]
) -> list[FieldValue]:
    """The fields an edit executes with: what the person gave, and for each kept row
    the person left empty, the value sealed with the operation (never one posted)."""
    by_name = {field.name: field for field in given}
    sealed = _given_fields(operation=operation)
    fields = []
    for row in rows:
        if row.name in by_name:
            fields.append(by_name[row.name])
        elif row.kept and row.name in sealed:
            fields.append(sealed[row.name])
    return fields


def edit_operations(*, operations: Iterable[Operation]) -> list[Operation]:
    """The operations an edit can execute: those waiting for a person."""
    return [o for o in operations if o.state == OperationState.HUMAN_REQUIRED]


def desk_now() -> dt.datetime:
    """The clock the gateway measures field ages on (the database's)."""
    return db_now()


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


def _problem_words(problem: Any) -> str | None:
    if not isinstance(problem, dict):
        return None
    name = problem.get("field", "a field")
    kind = problem.get("problem")
    if kind == ReasonCode.FIELD_MISSING:
        return f"{name} is missing"
    if kind == ReasonCode.FIELD_SOURCE_MISMATCH:
        return (
            f"{name} came from {problem.get('source')}; the contract wants "
            f"{problem.get('expected_source')}"
        )
    if kind == ReasonCode.FIELD_STALE:
        try:
            age = float(problem["age_s"])
            allowed = float(problem["max_age_s"])
        except (KeyError, TypeError, ValueError):
            return f"{name} is stale"
        if age < 0:
            return f"{name} was read in the future (check the read time)"
        return (
            f"{name} was read {human_age(dt.timedelta(seconds=age))} before the "
            f"check; the contract allows {human_age(dt.timedelta(seconds=allowed))}"
        )
    return None


def refusal_detail(*, evidence: Any) -> str:
    """A refusal's evidence in one sentence a person can act on."""
    if not isinstance(evidence, dict):
        return "see the new escalation's evidence below"
    words = [
        sentence
        for problem in evidence.get("conflicting_fields") or []
        if (sentence := _problem_words(problem))
    ]
    if words:
        return "; ".join(words)
    if evidence.get("current_version") is not None:
        return (
            f"the object is at version {evidence['current_version']}, "
            f"read at {evidence.get('version_read')}"
        )
    return "see the new escalation's evidence below"


@dataclass(frozen=True, kw_only=True)
class EditReport:
    ok: bool
    text: str


def edit_report(*, task: Task, outcome: takeover.EditOutcome) -> EditReport:
    """What an edit came to, in the sentence the desk shows."""
    result = outcome.result
    operation = result.operation
    if result.outcome == "verified":
        return EditReport(
            ok=True,
            text=(
                f"Executed: ticket {operation.provider_reference} verified; "
                "the task went back to the agent."
            ),
        )
    if result.outcome == "refused":
        evidence = (
            Escalation.objects.filter(tenant_id=task.tenant_id, pk=result.escalation_id)
            .values_list("evidence", flat=True)
            .first()
            if result.escalation_id
            else None
        )
        return EditReport(
            ok=False,
            text=(
                f"The gateway refused it again: {result.reason} — "
                f"{refusal_detail(evidence=evidence)}; the task stays with you."
            ),
        )
    if result.outcome == "failed":
        why = f" ({result.reason})" if result.reason else ""
        text = (
            f"The remote system {operation.target} rejected the call{why}: the "
            "operation failed (fail, cancel or hand back); the task stays with you."
        )
    elif result.outcome == "conflict":
        text = (
            f"The remote system {operation.target} answered with more than one "
            "receipt: verify the right one; the task stays with you."
        )
    else:
        text = (
            f"The call's outcome is in doubt ({result.reason or result.outcome}): "
            "the gateway looks the receipt up under the same key; the task stays "
            "with you."
        )
    return EditReport(ok=False, text=text)
