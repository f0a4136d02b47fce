"""What an agent may read back: a task's redacted story, a desk item's status.

Readable by the agent that owns them (it reserved or executed one of the task's
operations, ``selectors.task_get_for_agent``); for anyone else they do not exist.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Final

import mcp_types as types

from audit import selectors as audit_selectors
from portal.models import Agent
from tasks.api.serializers import EventOutputSerializer

from . import selectors
from .exceptions import UnknownResource
from .tools import desk_item_uri, story_uri

# The newest events of a story; the REST API pages through the rest.
STORY_EVENTS_MAX: Final = 200
_STORY: Final = re.compile(r"portal://tasks/(?P<id>[0-9a-fA-F-]{36})/story")
_DESK_ITEM: Final = re.compile(r"portal://desk-items/(?P<id>[0-9a-fA-F-]{36})")

TEMPLATES: Final = [
    types.ResourceTemplate(
        name="task-story",
        title="A task's story",
        uri_template=story_uri("{task_id}"),
        description="The task's state and its redacted events, oldest first.",
        mime_type="application/json",
    ),
    types.ResourceTemplate(
        name="desk-item",
        title="A desk item's status",
        uri_template=desk_item_uri("{desk_item_id}"),
        description="Why a person has the task, and whether they have decided.",
        mime_type="application/json",
    ),
]


def _story(*, agent: Agent, task_id: uuid.UUID) -> dict[str, Any]:
    task = selectors.task_get_for_agent(
        tenant=agent.tenant, agent=agent, task_id=task_id
    )
    events = list(
        audit_selectors.event_list(tenant=agent.tenant, task_id=task.pk).order_by(
            "-id"
        )[:STORY_EVENTS_MAX]
    )
    events.reverse()
    return {
        "task_id": str(task.pk),
        "state": task.state,
        "reason_code": task.reason_code,
        "object": {
            "type": task.object_type,
            "id": task.object_id,
            "version": task.object_version,
        },
        "contract": {"key": task.contract_key, "version": task.contract_version},
        "trace_id": task.trace_id,
        "events": EventOutputSerializer(events, many=True).data,
    }


def _desk_item(*, agent: Agent, item_id: uuid.UUID) -> dict[str, Any]:
    item = selectors.desk_item_get_for_agent(
        tenant=agent.tenant, agent=agent, item_id=item_id
    )
    return {
        "desk_item_id": str(item.pk),
        "reason_code": item.reason_code,
        "created_at": item.created_at.isoformat(),
        "resolved": item.resolved_at is not None,
        "resolved_at": item.resolved_at.isoformat() if item.resolved_at else None,
        "resolution": item.resolution or None,
        "task_id": str(item.task_id),
        "task_state": item.task.state,
        "operation_state": item.operation.state if item.operation else None,
        "story": story_uri(item.task_id),
    }


def resource_read(*, agent: Agent, uri: str) -> dict[str, Any]:
    """The JSON of one resource; run in the agent's tenant scope.

    Raises:
        UnknownResource: not a story or desk item URI.
        TaskNotFound: no such task or item, or not the agent's.
    """
    if match := _STORY.fullmatch(uri):
        return _story(agent=agent, task_id=uuid.UUID(match["id"]))
    if match := _DESK_ITEM.fullmatch(uri):
        return _desk_item(agent=agent, item_id=uuid.UUID(match["id"]))
    raise UnknownResource(uri)
