"""How the portal's pages show ids, actors, times, traces and payloads.

Pure rendering helpers; :class:`ActorNames` (portal/actor_names.py) turns the
actors of a page of rows into names with one query per actor kind.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Final

from django.conf import settings
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.redaction import redact
from portal.actor_names import EMPTY

SHORT_ID_CHARS: Final = 8


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
