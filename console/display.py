"""How the portal's pages show ids, actors, times, traces and payloads.

Pure rendering helpers plus :class:`ActorNames`, which turns the actors of a page of
rows into names with one query per actor kind (never one per row).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from django.conf import settings
from django.contrib.auth.models import User
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.redaction import redact
from portal.actors import ActorType
from portal.models import Agent

SHORT_ID_CHARS: Final = 8
EMPTY: Final = "—"


def short_id(value: object) -> str:
    """Eight characters that tell ids apart (the full id goes in a title).

    A trace id is random throughout: its first eight. A UUIDv7's first eight are its
    timestamp, the same for every row made in the same minute: its last eight, the
    random tail, marked with a leading ellipsis.
    """
    text = str(value)
    if len(text) == 36 and text.count("-") == 4:
        return "…" + text[-SHORT_ID_CHARS:]
    return text[:SHORT_ID_CHARS]


def when(value: dt.datetime | None) -> str:
    """A time to the millisecond, in the site's time zone."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value)
    return local.strftime("%Y-%m-%d %H:%M:%S.") + f"{local.microsecond // 1000:03d}"


def admin_url(model_label: str, object_id: object) -> str | None:
    """The admin change page of ``app_label.model`` ``object_id`` (None if absent)."""
    app_label, model = model_label.split(".")
    try:
        return reverse(f"admin:{app_label}_{model}_change", args=[object_id])
    except NoReverseMatch:
        return None


def id_link(url: str | None, value: object) -> SafeString | str:
    """A short id linking to ``url``; the full id is the title (hover, copy)."""
    if value in (None, ""):
        return EMPTY
    if url is None:
        return format_html('<code title="{}">{}</code>', value, short_id(value))
    return format_html(
        '<a href="{}" title="{}"><code>{}</code></a>', url, value, short_id(value)
    )


def model_link(model_label: str, value: object) -> SafeString | str:
    """A short id linking to its admin change page ("" when there is no id)."""
    if value in (None, ""):
        return ""
    return id_link(admin_url(model_label, value), value)


def trace_url(trace_id: str) -> str | None:
    """The trace viewer's page for ``trace_id`` (``PORTAL_TRACE_URL_TEMPLATE``)."""
    template = settings.PORTAL_TRACE_URL_TEMPLATE
    if not template or not trace_id:
        return None
    return str(template).format(trace_id=trace_id)


def trace_link(trace_id: str, *, short: bool = True) -> SafeString | str:
    """The trace id, linked to the trace viewer when one is configured."""
    if not trace_id:
        return EMPTY
    shown = short_id(trace_id) if short else trace_id
    url = trace_url(trace_id)
    if url is None:
        return format_html('<code title="{}">{}</code>', trace_id, shown)
    return format_html(
        '<a href="{}" title="{}" rel="noreferrer" target="_blank"><code>{}</code></a>',
        url,
        trace_id,
        shown,
    )


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def payload_lines(payload: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(key, value)`` lines of a JSON payload; nested keys read ``a.b`` / ``a[0]``."""
    if isinstance(payload, Mapping):
        if not payload and prefix:
            yield prefix, "{}"
        for key, item in payload.items():
            yield from payload_lines(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(payload, list):
        if not payload:
            yield prefix or "(list)", "[]"
        for index, item in enumerate(payload):
            yield from payload_lines(item, f"{prefix}[{index}]")
    else:
        yield prefix or "(value)", _scalar(payload)


def redacted_lines(value: Any, *, tenant_id: uuid.UUID) -> list[tuple[str, str]]:
    """``payload_lines`` of a stored JSON value passed through redaction again.

    The columns are redacted when written; rows written before that (or by a raw
    statement) still show only what an event payload could.
    """
    if value is None:
        return []
    data = value if isinstance(value, Mapping) else {"value": value}
    return list(payload_lines(redact(data, tenant_id=tenant_id)))


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
