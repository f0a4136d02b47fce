"""The event hash chain: what an event's hash covers (docs/audit-integrity.md).

Every event belongs to one chain: its task's (``task_id`` set) or its tenant's
(``task_id`` NULL, the rare tenant-level events). Within a chain, events are numbered
``chain_seq`` = 1, 2, … and each stores the hash of the one before it::

    hash = SHA-256( prev_hash ‖ RFC 8785 canonical JSON of the event's content )

with ``prev_hash`` as 64 lower-case hex digits (``GENESIS``, 64 zeros, for the first
event of a chain) and the hash written the same way. The content is every column that
says what happened: ``event_content`` lists them.

Two formats, told apart by the content's ``"v"``:

- v1 (events written before migration 0012, ``payload_digest`` NULL): the content
  holds the payload itself, under ``"payload"``.
- v2 (every event since): the content holds ``"payload_digest"`` instead, the
  SHA-256 (64 lower-case hex digits) of the RFC 8785 canonical payload (with the
  same large-integer rule as the content). Retention may later set the payload to
  NULL; the digest stays in its column and the hash still verifies. Where the
  payload is still there, the verifier also checks it against the digest.

``chain_seq`` itself is not covered: the links say the order, and the number only
finds the head quickly.

``event_append`` computes the hash inside its INSERT, because ``created_at`` is the
database's ``now()``: Python canonicalises everything else and hands the database the
canonical bytes before and after the ``created_at`` value (``content_pieces``); the
verifier (``audit/verify.py``) canonicalises the stored row in one piece. Both write
``created_at`` as ``CREATED_AT_SQL`` does.

Changing anything here changes every hash: the format is versioned (``"v"``) and a new
one needs a new version, never an edit.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import Any, Final

from portal import jcs

FORMAT_VERSION: Final = 2
FORMAT_V1: Final = 1
GENESIS: Final = "0" * 64
# ``created_at`` as text, in UTC with microseconds: the database writes it for the
# hash at insert time, and the verifier reads it back the same way.
CREATED_AT_SQL: Final = (
    """to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
)
# RFC 8785 numbers are IEEE 754 doubles: integers beyond this are hashed as strings.
_SAFE_INTEGER: Final = 2**53 - 1


def _hashable(value: Any) -> Any:
    """``value`` with integers outside the double-safe range as decimal strings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -_SAFE_INTEGER <= value <= _SAFE_INTEGER else str(value)
    if isinstance(value, Mapping):
        return {key: _hashable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_hashable(item) for item in value]
    return value


def stored_payload(payload_json: str) -> Any:
    """The payload as the database returns it from the JSON text event_append sends."""
    return json.loads(payload_json)


def event_content(
    *,
    event_id: uuid.UUID | str,
    tenant_id: uuid.UUID | str,
    task_id: uuid.UUID | str | None,
    operation_id: uuid.UUID | str | None,
    code: str,
    actor_type: str,
    actor_id: str,
    reason_code: str | None,
    contract_key: str | None,
    contract_version: int | None,
    payload: Any,
    trace_id: str,
    span_id: str,
    created_at: str,
    payload_digest: str | None = None,
) -> dict[str, Any]:
    """Everything an event's hash covers, as a JSON object.

    With ``payload_digest`` the content is format v2 (the digest stands for the
    payload, which may be None once dropped); without it, format v1.
    """
    if payload_digest is not None:
        v2 = _content(
            FORMAT_VERSION, event_id, tenant_id, task_id, operation_id, code,
            actor_type, actor_id, reason_code, contract_key, contract_version,
            trace_id, span_id, created_at,
        )  # fmt: skip
        v2["payload_digest"] = payload_digest
        return v2
    v1 = _content(
        FORMAT_V1, event_id, tenant_id, task_id, operation_id, code, actor_type,
        actor_id, reason_code, contract_key, contract_version, trace_id, span_id,
        created_at,
    )  # fmt: skip
    v1["payload"] = _hashable(payload)
    return v1


def payload_digest(payload: Any) -> str:
    """SHA-256 hex of the RFC 8785 canonical payload: what a v2 hash covers."""
    return hashlib.sha256(canonical(_hashable(payload))).hexdigest()


def _content(
    version: int,
    event_id: uuid.UUID | str,
    tenant_id: uuid.UUID | str,
    task_id: uuid.UUID | str | None,
    operation_id: uuid.UUID | str | None,
    code: str,
    actor_type: str,
    actor_id: str,
    reason_code: str | None,
    contract_key: str | None,
    contract_version: int | None,
    trace_id: str,
    span_id: str,
    created_at: str,
) -> dict[str, Any]:
    return {
        "v": version,
        "id": str(event_id),
        "tenant_id": str(tenant_id),
        "task_id": str(task_id) if task_id is not None else None,
        "operation_id": str(operation_id) if operation_id is not None else None,
        "code": code,
        "actor_type": actor_type,
        "actor_id": actor_id,
        "reason_code": reason_code,
        "contract_key": contract_key,
        "contract_version": contract_version,
        "trace_id": trace_id,
        "span_id": span_id,
        "created_at": created_at,
    }


def canonical(content: Any) -> bytes:
    """RFC 8785 canonical JSON of ``content`` (``portal.jcs``)."""
    return jcs.dumps(content)


def event_hash(*, prev_hash: str | None, content: Mapping[str, Any]) -> str:
    """The hash of an event whose predecessor's hash is ``prev_hash`` (None: first)."""
    digest = hashlib.sha256((prev_hash or GENESIS).encode("ascii"))
    digest.update(canonical(content))
    return digest.hexdigest()


def content_pieces(content: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """The canonical bytes before and after the ``created_at`` string's characters.

    ``content["created_at"]`` is replaced by a random marker, so a payload that
    happens to contain the same text cannot move the split.
    """
    marker = uuid.uuid4().hex
    text = canonical({**content, "created_at": marker})
    before, found, after = text.partition(f'"{marker}"'.encode("ascii"))
    if not found:  # pragma: no cover - a string key always serialises quoted
        raise RuntimeError("created_at marker missing from canonical event content")
    return before + b'"', b'"' + after
