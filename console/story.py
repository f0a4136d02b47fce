"""A task's whole story, read for its admin page: events, operations, escalations.

One query per section whatever the task's size: the events (bounded by
``EVENT_LIMIT``, oldest first), the operations, their credentials, their approvals
and the approvers' decisions, the escalations with the person who resolved each,
then at most two for the actors' names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from django.db.models import Prefetch
from django.urls import reverse
from django.utils.html import format_html

from audit.models import Event
from portal.actor_names import ActorNames
from tasks.models import (
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
    )


def event_rows(events: list[Event], names: ActorNames) -> list[dict[str, Any]]:
    """Events as the task's story shows them (admin/console/event_table.html), in
    the order given: time to the millisecond, the actor by name, the payload as
    key/value lines. The takeover desk shows a task's events the same way."""
    return [
        {
            "id": model_link("audit.event", event.pk),
            "when": when(event.created_at),
            "actor": names.actor_html(event.actor_type, event.actor_id),
            "code": event.code,
            "reason": event.reason_code or "",
            "contract": (
                f"{event.contract_key} v{event.contract_version}"
                if event.contract_key
                else ""
            ),
            "operation": model_link("tasks.operation", event.operation_id),
            "payload": list(payload_lines(event.payload)),
            "trace": trace_link(event.trace_id),
            "span": format_html("<code>{}</code>", event.span_id)
            if event.span_id
            else "",
        }
        for event in events
    ]


def story_context(story: TaskStory) -> dict[str, Any]:
    """The rows the task page renders: links, names and readable payloads."""
    names = story.names
    task = story.task
    events = event_rows(story.events, names)
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
