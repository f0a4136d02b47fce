"""A task's whole story, read for its admin page: events, operations, escalations.

One query per section whatever the task's size: the events (bounded by
``EVENT_LIMIT``, oldest first), the operations, their credentials, their approvals
and the approvers' decisions, the escalations with the person who resolved each,
then at most two for the actors' names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from django.db.models import Prefetch
from django.urls import reverse
from django.utils.html import format_html

from audit.models import Event, EventCode
from portal.actor_names import ActorNames
from tasks.models import (
    TASK_TERMINAL_STATES,
    Approval,
    ApprovalDecision,
    Credential,
    Escalation,
    Operation,
    Task,
)

from .display import (
    model_link,
    payload_lines,
    redacted_lines,
    trace_link,
    when,
)
from .takeover_desk.comments import desk_comment_texts

EVENT_LIMIT: Final = 500

# What the timeline shows of an event; the rest is on the event's own page.
_EVENT_COLUMNS: Final = (
    "id",
    "task_id",
    "operation_id",
    "created_at",
    "code",
    "actor_type",
    "actor_id",
    "reason_code",
    "contract_key",
    "contract_version",
    "payload",
    "trace_id",
    "span_id",
)

# Credential metadata only: the secret's hash never leaves the table.
_CREDENTIAL_COLUMNS: Final = (
    "id",
    "operation_id",
    "object_type",
    "object_id",
    "fields",
    "action",
    "target",
    "issued_at",
    "expires_at",
    "revoked_at",
)


@dataclass(kw_only=True)
class OperationStory:
    operation: Operation
    credentials: list[Credential] = field(default_factory=list)
    approvals: list[Approval] = field(default_factory=list)


@dataclass(kw_only=True)
class TaskStory:
    task: Task
    events: list[Event]
    more_events: bool
    operations: list[OperationStory]
    escalations: list[Escalation]
    names: ActorNames
    # The desk comments' texts by id, for their ``task.commented`` rows.
    comments: dict[str, str] = field(default_factory=dict)

    @property
    def lease_owner(self) -> str:
        return self.names.owner_label(self.task.lease_owner)


def task_story(*, task: Task, event_limit: int = EVENT_LIMIT) -> TaskStory:
    """Everything recorded about ``task``, each section in one query.

    The task was already read through the person's tenant scope; every query here
    is keyed by ``(tenant_id, task_id)``, so nothing of another tenant can join in.
    """
    events = list(
        Event.objects.filter(tenant_id=task.tenant_id, task_id=task.pk)
        .only(*_EVENT_COLUMNS)
        .order_by("id")[: event_limit + 1]
    )
    more_events = len(events) > event_limit
    events = events[:event_limit]
    operations = list(
        Operation.objects.filter(tenant_id=task.tenant_id, task_id=task.pk)
        .defer("input", "field_provenance")
        .order_by("created_at", "id")
    )
    by_operation: dict[Any, OperationStory] = {
        operation.pk: OperationStory(operation=operation) for operation in operations
    }
    if by_operation:
        credentials = (
            Credential.objects.filter(
                tenant_id=task.tenant_id, operation_id__in=list(by_operation)
            )
            .only(*_CREDENTIAL_COLUMNS)
            .order_by("issued_at", "id")
        )
        for credential in credentials:
            by_operation[credential.operation_id].credentials.append(credential)
        approvals = (
            Approval.objects.filter(
                tenant_id=task.tenant_id, operation_id__in=list(by_operation)
            )
            .prefetch_related(
                Prefetch(
                    "decisions",
                    ApprovalDecision.objects.select_related("person").order_by(
                        "decided_at", "id"
                    ),
                )
            )
            .order_by("requested_at", "id")
        )
        for approval in approvals:
            by_operation[approval.operation_id].approvals.append(approval)
    escalations = list(
        Escalation.objects.filter(tenant_id=task.tenant_id, task_id=task.pk)
        .select_related("resolved_by")
        .order_by("created_at", "id")
    )
    actors = [(event.actor_type, event.actor_id) for event in events]
    actors.append(ActorNames.split_owner(task.lease_owner))
    return TaskStory(
        task=task,
        events=events,
        more_events=more_events,
        operations=list(by_operation.values()),
        escalations=escalations,
        names=ActorNames(actors, tenant_ids=[task.tenant_id]),
        comments=(
            desk_comment_texts(task=task)
            if any(e.code == EventCode.TASK_COMMENTED for e in events)
            else {}
        ),
    )


def event_rows(
    events: list[Event],
    names: ActorNames,
    comments: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Events as the task's story shows them (admin/console/event_table.html), in
    the order given (oldest first): one row per step, time to the millisecond, how
    long after the step before (``after``), the actor by name, the payload as
    key/value lines. The takeover desk shows a task's events the same way.

    A comment on the desk (``task.commented``) shows its text, from ``comments``
    (by comment id: ``takeover_desk.comments.desk_comment_texts``), where its
    event stands; the event itself carries only the id, length and digest.

    One call's checks are one row: a check pass is one ``gateway.checked`` event
    (its verdicts summed up in one ``checks`` line, the refusing check's evidence
    after it), and the one-event-per-check rows written before issue 23 fold into
    one row too. A person's part gets a ``note``: how long the task waited on the
    desk before someone claimed it, and how long they held it.
    """
    rows: list[dict[str, Any]] = []
    previous_at: dt.datetime | None = None
    escalated_at: dt.datetime | None = None
    claimed: tuple[dt.datetime, str] | None = None
    for step in _steps(events):
        first = step[0]
        at = first.created_at
        note = ""
        if first.code == EventCode.TASK_ESCALATED:
            escalated_at = at
        elif first.code == EventCode.TASK_HUMAN_CLAIMED:
            who = names.label(first.actor_type, first.actor_id)
            if escalated_at is not None:
                note = f"waited {duration(at - escalated_at)} on the desk"
            claimed, escalated_at = (at, who), None
        elif (
            first.code in (EventCode.TASK_HUMAN_RELEASED, EventCode.TASK_RESOLVED)
            and claimed is not None
        ):
            note = f"held {duration(at - claimed[0])} by {claimed[1]}"
            claimed = None
        rows.append(
            {
                "id": model_link("audit.event", first.pk),
                "when": when(at),
                "after": f"+{duration(at - previous_at)}" if previous_at else "",
                "note": note,
                "actor": names.actor_html(first.actor_type, first.actor_id),
                "code": first.code,
                "reason": next((e.reason_code for e in step if e.reason_code), "")
                or "",
                "contract": (
                    f"{first.contract_key} v{first.contract_version}"
                    if first.contract_key
                    else ""
                ),
                "operation": model_link("tasks.operation", first.operation_id),
                "payload": _step_lines(step, comments or {}),
                "trace": trace_link(first.trace_id),
                "span": format_html("<code>{}</code>", first.span_id)
                if first.span_id
                else "",
            }
        )
        previous_at = step[-1].created_at
    return rows


def _is_check(event: Event) -> bool:
    return event.code == EventCode.GATEWAY_CHECKED and isinstance(event.payload, dict)


def _steps(events: list[Event]) -> list[list[Event]]:
    """The events grouped into steps: a run of one-check ``gateway.checked`` events
    (the form before issue 23) of one operation and actor is one step; every other
    event is a step of its own."""
    steps: list[list[Event]] = []
    for event in events:
        last = steps[-1][-1] if steps else None
        if (
            last is not None
            and _is_check(event)
            and _is_check(last)
            and "checks" not in event.payload
            and "checks" not in last.payload
            and last.operation_id == event.operation_id is not None
            and (last.actor_type, last.actor_id) == (event.actor_type, event.actor_id)
        ):
            steps[-1].append(event)
        else:
            steps.append([event])
    return steps


def _step_lines(
    step: list[Event], comments: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The key/value lines of a step: a check pass's verdicts on one line, then
    what the refusing check said; a comment's text; any other event's payload as
    it is."""
    first = step[0]
    if first.code == EventCode.TASK_COMMENTED and isinstance(first.payload, dict):
        text = comments.get(str(first.payload.get("comment_id")))
        if text is not None:
            return [("comment", text)]
    if not _is_check(first):
        return list(payload_lines(first.payload))
    entries: list[dict[str, Any]] = []
    for event in step:
        payload = event.payload
        entries.extend(payload.get("checks", [payload]))
    passed = [e for e in entries if e.get("verdict") != "refused"]
    refused = [e for e in entries if e.get("verdict") == "refused"]
    summary = ", ".join(f"{e.get('check')} ✓" for e in passed)
    summary += ", " if passed and refused else ""
    summary += ", ".join(f"{e.get('check')} ✗" for e in refused)
    lines = [("checks", summary or "—")]
    for entry in refused:
        evidence = {
            key: value
            for key, value in entry.items()
            if key not in ("check", "verdict")
        }
        lines.extend(payload_lines(evidence, str(entry.get("check"))))
    if "checks" in first.payload:  # anything else the pass's event says
        lines.extend(
            payload_lines(
                {
                    key: value
                    for key, value in first.payload.items()
                    if key not in ("check", "checks", "verdict")
                }
            )
        )
    return lines


def duration(delta: dt.timedelta) -> str:
    """A step's distance from the one before, read at a glance: ms, s, min, h."""
    seconds = max(delta.total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.0f} min"
    hours, rest = divmod(round(minutes), 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def is_live(task: Task) -> bool:
    """Whether the task may still change: its pages refresh their timeline."""
    return task.state not in TASK_TERMINAL_STATES


def story_context(story: TaskStory) -> dict[str, Any]:
    """The rows the task page renders: links, names and readable payloads."""
    names = story.names
    task = story.task
    events = event_rows(story.events, names, story.comments)
    operations = [
        {
            "id": model_link("tasks.operation", item.operation.pk),
            "operation": item.operation,
            "updated": when(item.operation.updated_at),
            "trace": trace_link(item.operation.trace_id),
            "result": redacted_lines(
                item.operation.result, tenant_id=item.operation.tenant_id
            ),
            "credentials": [
                {
                    "id": model_link("tasks.credential", c.pk),
                    "credential": c,
                    "issued": when(c.issued_at),
                    "expires": when(c.expires_at),
                    "revoked": when(c.revoked_at) if c.revoked_at else "",
                    "fields": ", ".join(str(f) for f in c.fields or []),
                }
                for c in item.credentials
            ],
            "approvals": [
                {
                    "id": model_link("tasks.approval", a.pk),
                    "approval": a,
                    "groups": ", ".join(str(g) for g in a.groups) or "the desk",
                    "requested": when(a.requested_at),
                    "expires": when(a.expires_at) if a.expires_at else "",
                    "decisions": [
                        {
                            "who": d.person.get_username(),
                            "verdict": d.verdict,
                            "reason": d.reason,
                            "when": when(d.decided_at),
                            "saw_digest": d.saw_digest,
                        }
                        for d in a.decisions.all()
                    ],
                }
                for a in item.approvals
            ],
        }
        for item in story.operations
    ]
    escalations = [
        {
            "id": model_link("tasks.escalation", e.pk),
            "escalation": e,
            "operation": model_link("tasks.operation", e.operation_id),
            "created": when(e.created_at),
            "resolved": when(e.resolved_at) if e.resolved_at else "",
            "resolved_by": e.resolved_by.get_username() if e.resolved_by else "",
            "evidence": redacted_lines(e.evidence, tenant_id=e.tenant_id),
        }
        for e in story.escalations
    ]
    return {
        "story_events": events,
        "story_live": is_live(task),
        "story_more_events": story.more_events,
        "story_all_events_url": events_of_task_url(task.pk),
        "story_operations": operations,
        "story_escalations": escalations,
        "story_lease": {
            "owner": story.lease_owner,
            "token": task.lease_token,
            "acquired": when(task.lease_acquired_at),
            "expires": when(task.lease_expires_at),
        },
        "story_trace": trace_link(task.trace_id, short=False),
    }


def events_of_task_url(task_id: object) -> str:
    """The event browser filtered to one task."""
    return f"{reverse('admin:audit_event_changelist')}?task={task_id}"
