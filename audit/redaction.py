"""Redaction: what may go into an event payload (DESIGN.md invariant 7).

Secrets, credentials and prompts are replaced by a marker; long strings are cut to a
prefix plus a SHA-256 reference; a payload that is still over the bound is replaced by
a summary of its keys. The database CHECK is the backstop, this is the policy.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from django.conf import settings

REDACTED: Final = "[REDACTED]"
MAX_STRING_CHARS: Final = 256
MAX_DEPTH: Final = 6
MAX_ITEMS: Final = 50

# Keys whose values never go into the audit trail, whatever they hold.
_SENSITIVE_KEY = re.compile(
    r"(secret|token|password|passwd|api[_-]?key|authorization|credential|cookie|"
    r"session|private|prompt|completion|ssn|card[_-]?number)",
    re.IGNORECASE,
)
# Keys the pattern above would catch that name public facts, not secrets: the
# fencing token is a counter, and the audit trail must show which lease wrote.
_PUBLIC_KEYS: Final = frozenset({"lease_token"})
# Values that look like credentials, whatever their key.
_SENSITIVE_VALUE = re.compile(
    r"(agp_[0-9a-f]{12}\.|bearer\s+\S+|-----BEGIN [A-Z ]*PRIVATE KEY-----|"
    r"\b(?:sk|pk|rk)_(?:live|test)_[0-9a-zA-Z]{8,}|\bAKIA[0-9A-Z]{16}\b|"
    r"eyJ[0-9A-Za-z_-]{8,}\.[0-9A-Za-z_-]{8,}\.)",
    re.IGNORECASE,
)


def _reference(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _redact(value: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        return "[TOO DEEP]"
    if isinstance(value, Mapping):
        items = list(value.items())
        out: dict[str, Any] = {}
        for key, item in items[:MAX_ITEMS]:
            name = str(key)[:MAX_STRING_CHARS]
            out[name] = (
                REDACTED
                if _SENSITIVE_KEY.search(name) and name not in _PUBLIC_KEYS
                else _redact(item, depth + 1)
            )
        if len(items) > MAX_ITEMS:
            out["_omitted_keys"] = len(items) - MAX_ITEMS
        return out
    if isinstance(value, list | tuple):
        kept = [_redact(item, depth + 1) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            kept.append(f"[{len(value) - MAX_ITEMS} more items]")
        return kept
    if isinstance(value, str):
        if _SENSITIVE_VALUE.search(value):
            return REDACTED
        if len(value) > MAX_STRING_CHARS:
            return f"{value[:64]}… ({len(value)} chars, {_reference(value)})"
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    return _redact(str(value), depth)


def redact_payload(data: Mapping[str, Any]) -> dict[str, Any]:
    """A redacted copy of ``data`` that fits the event payload bound.

    Guarantee: the result serialises to at most ``PORTAL_EVENT_PAYLOAD_MAX_BYTES``
    bytes of JSON and holds no value under a sensitive key.
    """
    redacted = _redact(dict(data), depth=0)
    encoded = json.dumps(redacted, separators=(",", ":"), ensure_ascii=False)
    if len(encoded.encode()) <= settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES // 2:
        return dict(redacted)
    # Too big even after redaction: keep the shape, drop the values.
    return {
        "_truncated": True,
        "_reference": _reference(encoded),
        "_keys": sorted(str(key)[:64] for key in redacted)[:MAX_ITEMS],
    }
