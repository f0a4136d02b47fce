"""Names of the agents and people among some actors, as every page and export shows
them: at most two queries (one per actor kind), never one per row. The console's
pages, the event export and the evidence bundle read names here."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Final

from django.contrib.auth.models import User
from django.utils.html import format_html
from django.utils.safestring import SafeString

from portal.actors import ActorType
from portal.models import Agent

EMPTY: Final = "—"


def _as_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _as_int(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) < 19 else None


class ActorNames:
    """Names of the agents and people among some actors: at most two queries.

    Actors are ``(actor_type, actor_id)`` pairs as events store them, or lease owners
    such as ``user:4`` (a person's claim). System actors are components and keep
    their own name. Agents are looked up only in ``tenant_ids`` (the rows' own
    tenants); people are accounts, which belong to no tenant.
    """

    def __init__(
        self, actors: Iterable[tuple[str, str]], *, tenant_ids: Iterable[uuid.UUID]
    ) -> None:
        agent_ids: set[uuid.UUID] = set()
        user_ids: set[int] = set()
        for actor_type, actor_id in actors:
            if actor_type == ActorType.AGENT and (agent := _as_uuid(actor_id)):
                agent_ids.add(agent)
            elif (
                actor_type == ActorType.USER and (user := _as_int(actor_id)) is not None
            ):
                user_ids.add(user)
        self.agents: dict[str, str] = {}
        self.users: dict[str, str] = {}
        tenants = set(tenant_ids)
        if agent_ids and tenants:
            self.agents = {
                str(pk): name
                for pk, name in Agent.objects.filter(
                    tenant_id__in=tenants, pk__in=agent_ids
                ).values_list("pk", "name")
            }
        if user_ids:
            self.users = {
                str(pk): username
                for pk, username in User.objects.filter(pk__in=user_ids).values_list(
                    "pk", "username"
                )
            }

    @staticmethod
    def split_owner(owner: str | None) -> tuple[str, str]:
        """``"user:4"`` → ``("user", "4")``; a bare agent id (how escalations name
        their responsible agent) → ``("agent", id)``; a worker's own name stays."""
        if owner and ":" in owner:
            kind, _, rest = owner.partition(":")
            if kind in ActorType.values:
                return kind, rest
        if owner and _as_uuid(owner) is not None:
            return ActorType.AGENT, owner
        return "", owner or ""

    def name(self, actor_type: str, actor_id: str) -> str | None:
        """The agent's name or the person's username; None when unknown."""
        if actor_type == ActorType.AGENT:
            return self.agents.get(actor_id)
        if actor_type == ActorType.USER:
            return self.users.get(actor_id)
        return None

    def label(self, actor_type: str, actor_id: str) -> str:
        """``name (agent)``, ``username (person)``, ``component (system)``."""
        if actor_type == ActorType.AGENT:
            name = self.agents.get(actor_id)
            return f"{name} (agent)" if name else f"agent:{actor_id}"
        if actor_type == ActorType.USER:
            name = self.users.get(actor_id)
            return f"{name} (person)" if name else f"user:{actor_id}"
        if actor_type == ActorType.SYSTEM:
            return f"{actor_id} (system)"
        return actor_id or EMPTY

    def owner_label(self, owner: str | None) -> str:
        """A lease owner by name (people and agents), else the worker's name."""
        if not owner:
            return EMPTY
        kind, rest = self.split_owner(owner)
        return self.label(kind, rest) if kind else rest

    def actor_html(self, actor_type: str, actor_id: str) -> SafeString:
        """The actor's name, with its stored ``type:id`` as the title."""
        return format_html(
            '<span title="{}:{}">{}</span>',
            actor_type,
            actor_id,
            self.label(actor_type, actor_id),
        )
