"""Display helpers of the desk: owners' names and how long something waited."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable

from portal.actor_names import ActorNames
from portal.actors import ActorType


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
