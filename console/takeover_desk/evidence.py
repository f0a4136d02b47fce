"""The desk item's evidence panel: what a person reads before deciding.

The open escalation (else the latest) supplies the plan, conflicting fields and
receipts; the current object version is read live; the task's latest events come
as the story renders them (``console.story.event_rows``); the SLA clocks come from
routing/. All of it redacted for display, in a fixed number of queries.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from audit.models import Event, EventCode
from audit.redaction import redact
from portal.actor_names import ActorNames
from portal.db import db_now
from routing import selectors as routing_selectors
from tasks.models import Escalation, ObjectVersion, Operation, Task

from ..story import event_rows, is_live
from .comments import desk_comment_texts
from .forms import resolution_label
from .names import owner_names

EVENTS_SHOWN: Final = 50


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
        comments=(
            desk_comment_texts(task=task)
            if any(e.code == EventCode.TASK_COMMENTED for e in events)
            else None
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
