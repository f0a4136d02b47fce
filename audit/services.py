"""Writes to the audit trail. ``event_append`` is the only writer of events."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Any, Final

from django.conf import settings
from django.db import connection

from portal import db as portal_db
from portal import jcs
from portal.actors import Actor
from portal.ids import new_id
from portal.tracing import NO_TRACE, Trace

from . import chain, relay
from .redaction import json_dumps as json_text  # for ::jsonb parameters, as stored
from .redaction import redact

ENVELOPE_SCHEMA_VERSION: Final = 1

# The event with its chain link (audit/chain.py), in one statement (audit migration
# 0017). ``moved`` advances the chain's head row (``audit_chainhead``) and computes the
# new link from the row it locked: in READ COMMITTED a concurrent append to the same
# chain waits for that lock until commit and then re-evaluates the UPDATE on the row
# the first one left, so appends to one chain line up even when their callers hold
# only a share lock on the task; the partial unique indexes on ``chain_seq`` refuse a
# fork within a month partition regardless. A chain's first event finds no row and
# makes it (``begun``); when a concurrent first append made it first, nothing is
# written and ``event_append`` runs the statement again. The hash is computed here
# because ``created_at`` is the database's ``now()``.
_LINK_HASH = f"""encode(sha256(
        convert_to(COALESCE({{prev}}, '{chain.GENESIS}'), 'UTF8')
        || %(content_before)s::bytea
        || convert_to({chain.CREATED_AT_SQL.format(column="now()")}, 'UTF8')
        || %(content_after)s::bytea
    ), 'hex')"""


def _chained_event_ctes(
    *, chain_of: str, link_hash: str, body: bool, on_conflict: str, returning: str
) -> str:
    """The chained event insert, as CTEs ``moved``, ``begun``, ``link`` and
    ``event``: the chain's head row moves (or is made), and the event takes its link.

    The one text for both writers: ``event_append``'s statements (``body`` False: the
    payload and its digest are parameters) and ``slotted_event_sql``'s (``body``
    True: they come from the caller's ``body`` CTE, which the statement completes).
    ``chain_of`` is the head row's task condition (two texts, so that each uses the
    chain's index); ``link_hash`` the link's hash expression with a ``{prev}`` slot.
    """
    from_body = "\n    FROM body" if body else ""
    payload = (
        "body.text::jsonb, body.digest"
        if body
        else ("%(payload)s::jsonb, %(payload_digest)s")
    )
    return f"""moved AS (
    UPDATE audit_chainhead AS h
    SET head_seq = h.head_seq + 1, head_event_id = %(id)s, prev_hash = h.head_hash,
        head_hash = {link_hash.format(prev="h.head_hash")}{from_body}
    WHERE h.tenant_id = %(tenant_id)s AND {chain_of}
    RETURNING h.head_seq, h.prev_hash, h.head_hash
), begun AS (
    INSERT INTO audit_chainhead AS h (
        tenant_id, task_id, head_seq, head_event_id, prev_hash, head_hash
    )
    SELECT %(tenant_id)s, %(task_id)s, 1, %(id)s, NULL,
        {link_hash.format(prev="NULL")}{from_body}
    WHERE NOT EXISTS (SELECT FROM moved){on_conflict}
    RETURNING h.head_seq, h.prev_hash, h.head_hash
), link AS (
    SELECT * FROM moved UNION ALL SELECT * FROM begun
), event AS (
    INSERT INTO audit_event (
        id, tenant_id, task_id, operation_id, code, actor_type, actor_id,
        reason_code, contract_key, contract_version, payload, payload_digest,
        trace_id, span_id, created_at, chain_seq, prev_hash, hash
    )
    SELECT %(id)s, %(tenant_id)s, %(task_id)s, %(operation_id)s, %(code)s,
        %(actor_type)s, %(actor_id)s, %(reason_code)s, %(contract_key)s,
        %(contract_version)s, {payload}, %(trace_id)s,
        %(span_id)s, now(), link.head_seq, link.prev_hash, link.head_hash
    FROM link{", body" if body else ""}
    RETURNING {returning}
)"""


def _insert_event(chain_of: str) -> str:
    """``event_append``'s chained insert, ending in ``event``; a concurrent first
    append to the chain makes it write nothing (``event_append`` tries again)."""
    return "\n" + _chained_event_ctes(
        chain_of=chain_of,
        link_hash=_LINK_HASH,
        body=False,
        on_conflict="\n    ON CONFLICT (tenant_id, task_id) DO NOTHING",
        returning="tenant_id, id",
    )


_TASK_CHAIN: Final = "h.task_id = %(task_id)s"
_TENANT_CHAIN: Final = "h.task_id IS NULL"

# ``generic``: the outbox row's composite foreign key onto the partitioned
# audit_event is checked by PostgreSQL's RI trigger through a cached plan; left to
# choose, the plan cache re-plans it for every row (a custom plan looks cheaper
# than the generic one over all partitions), which cost about 1.3 ms per row with
# five partitions and 1.9 ms with 27 (docs/retention.md). A generic plan prunes the
# partitions at executor start instead. Transaction-local, like every setting here;
# for the rest of the caller's transaction every plan PostgreSQL caches (PL/pgSQL,
# RI checks, the ORM's server-side prepared statements) is generic: the hot paths'
# statements are key lookups, whose generic plan is the custom one.
_OUTBOX_FROM_EVENT: Final = """
INSERT INTO audit_outbox (
    id, tenant_id, event_id, topic, key, payload, state, attempts, last_error
)
SELECT %(outbox_id)s, event.tenant_id, event.id, %(code)s, %(key)s,
    %(envelope)s::jsonb, 'pending', 0, ''
FROM event CROSS JOIN generic
"""
_GENERIC: Final = (
    "generic AS (SELECT set_config('plan_cache_mode', 'force_generic_plan', true))"
)

# The event and its outbox row in one statement: one round trip on the hot paths.
# Task chains (nearly every event) and the tenant's chain; with and without the
# outbox row. Each writes one row (the outbox's, or the event's), or none when a
# concurrent first append made the chain's head row first.
_INSERT_TASK_EVENT_AND_OUTBOX: Final = (
    f"WITH {_GENERIC}, {_insert_event(_TASK_CHAIN)}{_OUTBOX_FROM_EVENT}"
)
_INSERT_TENANT_EVENT_AND_OUTBOX: Final = (
    f"WITH {_GENERIC}, {_insert_event(_TENANT_CHAIN)}{_OUTBOX_FROM_EVENT}"
)
_INSERT_TASK_EVENT: Final = f"WITH {_insert_event(_TASK_CHAIN)} SELECT id FROM event"
_INSERT_TENANT_EVENT: Final = (
    f"WITH {_insert_event(_TENANT_CHAIN)} SELECT id FROM event"
)
# A first append that lost the race to make its chain's head row runs again and
# then finds the row; more than one more turn means something else is wrong.
_APPEND_TURNS: Final = 3


def payload_text_and_digest(payload: Any) -> tuple[str, str]:
    """The JSON text an event's payload is stored from, and its digest (the SHA-256
    of the RFC 8785 form of what the database stores).

    When ``portal.jcs`` writes the payload with the standard library (strings,
    safe integers, booleans, null, lists, objects with BMP keys: what ``redact``
    returns without floats or big integers), the canonical text is the stored text
    too (``jsonb`` keeps no key order): one serialisation for both. Otherwise the
    compact text, and the digest of the value the database reads back from it.
    """
    if jcs.stdlib_agrees(payload):
        canonical = chain.canonical(payload)
        return canonical.decode("utf-8"), hashlib.sha256(canonical).hexdigest()
    payload_json = json_text(payload)
    return payload_json, chain.payload_digest(chain.stored_payload(payload_json))


def event_params(
    *,
    event_id: uuid.UUID,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID | None,
    operation_id: uuid.UUID | None,
    code: str,
    actor_type: str,
    actor_id: str,
    reason_code: str | None,
    contract_key: str | None,
    contract_version: int | None,
    payload: Any,
    trace_id: str,
    span_id: str,
) -> dict[str, Any]:
    """Parameters of the chained event insert (``_insert_event``) for an already
    redacted ``payload``, including the canonical content around ``created_at``
    that the statement hashes (audit/chain.py, format v2: the hash covers the
    payload's digest, stored beside it)."""
    columns: dict[str, Any] = {
        "tenant_id": tenant_id,
        "task_id": task_id,
        "operation_id": operation_id,
        "code": code,
        "actor_type": actor_type,
        "actor_id": actor_id,
        "reason_code": reason_code,
        "contract_key": contract_key,
        "contract_version": contract_version,
        "trace_id": trace_id,
        "span_id": span_id,
    }
    payload_json, digest = payload_text_and_digest(payload)
    content = chain.event_content(
        event_id=event_id,
        payload=None,
        payload_digest=digest,
        created_at="",
        **columns,
    )
    before, after = chain.content_pieces(content)
    return {
        "id": event_id,
        "payload": payload_json,
        "payload_digest": digest,
        "content_before": before,
        "content_after": after,
        **columns,
    }


def event_append(
    *,
    tenant_id: uuid.UUID,
    code: str,
    actor: Actor,
    task_id: uuid.UUID | None = None,
    operation_id: uuid.UUID | None = None,
    reason: str | None = None,
    contract: tuple[str, int] | None = None,
    data: Mapping[str, Any] | None = None,
    trace: Trace = NO_TRACE,
    publish: bool = True,
) -> uuid.UUID:
    """Append one event and, when ``publish``, its outbox row, in the caller's txn.

    ``data``: the payload, built with its code's definition in ``audit.payloads``
    (``payloads.TaskWoken({...})``), so that mypy checks it; outside tests and
    benchmarks, ``tests/unit/audit/test_payloads.py`` refuses a bare dict literal.

    Guarantee: the payload is redacted (``audit.redaction.redact``: value detectors,
    sensitive key names, docs/redaction.md) and bounded before it is written, and
    the outbox row carries the same redacted payload; the event and
    its outbox row commit or roll back with the caller's state change. The event is
    linked into its chain (the task's, or the tenant's when ``task_id`` is None):
    appends to one chain wait for each other on the lock of the chain's head row,
    released at commit; different chains never wait for each other. Needs READ
    COMMITTED (the default): the head is read after the lock, with a fresh snapshot.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    trace = trace.or_current()  # NO_TRACE: the current span's ids, if any
    payload = redact(
        dict(data or {}),
        tenant_id=tenant_id,
        max_bytes=settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES // 2,
    )
    event_id = new_id()
    contract_key, contract_version = contract if contract else (None, None)
    params = event_params(
        event_id=event_id,
        tenant_id=tenant_id,
        task_id=task_id,
        operation_id=operation_id,
        code=code,
        actor_type=actor.type,
        actor_id=actor.id,
        reason_code=reason,
        contract_key=contract_key,
        contract_version=contract_version,
        payload=payload,
        trace_id=trace.trace_id,
        span_id=trace.span_id,
    )
    if publish:
        statement = _INSERT_TENANT_EVENT_AND_OUTBOX
        if task_id:
            statement = _INSERT_TASK_EVENT_AND_OUTBOX
        params = {
            **params,
            "outbox_id": new_id(),
            "key": str(event_id),
            "envelope": json_text(
                {
                    "schema_version": ENVELOPE_SCHEMA_VERSION,
                    "event_id": str(event_id),
                    "code": code,
                    "tenant_id": str(tenant_id),
                    "task_id": str(task_id) if task_id else None,
                    "operation_id": str(operation_id) if operation_id else None,
                    "reason_code": reason,
                    "data": payload,
                    "trace_id": trace.trace_id,
                }
            ),
        }
    else:
        statement = _INSERT_TASK_EVENT if task_id else _INSERT_TENANT_EVENT
    with connection.cursor() as cursor:
        for _ in range(_APPEND_TURNS):
            cursor.execute(statement, params)
            if cursor.rowcount == 1:
                break
        else:
            raise RuntimeError(
                f"event_append: the head row of chain ({tenant_id}, {task_id})"
                f" was neither moved nor made in {_APPEND_TURNS} turns"
            )
    if not publish:
        return event_id
    if settings.PORTAL_RELAY_NUDGE:
        relay.nudge_relay()  # after commit; beat is the safety net
    return event_id


# --- An event whose payload the statement completes ---------------------------------
#
# One round trip per state change (issue 23): the caller's data-modifying CTE (the
# task's state write) and the event, its chain link and its outbox row in one
# statement. Some payload values are only known to the database (the state a task
# moved from, its current step), so the payload's canonical JSON is cut at those
# values ("slots") and the statement puts them in: each slot is a SQL expression
# that yields the value's JSON text, read from the caller's CTE. PostgreSQL writes a
# JSON string as RFC 8785 does (``to_jsonb(text)::text``: the same escapes, lower-case
# hex, every other character as UTF-8), so the text the statement hashes is the
# canonical JSON ``payload_digest`` would compute, and the verifier recomputes the
# same digest from the stored payload. The caller redacts the slots' values (they
# are not in the payload Python redacted): see ``task_transition``.
_SLOTTED_HASH = f"""encode(sha256(
        convert_to(COALESCE({{prev}}, '{chain.GENESIS}'), 'UTF8')
        || %(_c0)s::bytea
        || convert_to({chain.CREATED_AT_SQL.format(column="now()")}, 'UTF8')
        || %(_c1)s::bytea || convert_to(body.digest, 'UTF8') || %(_c2)s::bytea
    ), 'hex')"""


def slotted_event_sql(*, source: str, slots: tuple[str, ...]) -> str:
    """CTEs after the caller's ``source`` CTE: the task chain's event and outbox row.

    ``slots`` are SQL expressions over ``source`` (one row, or none: then nothing is
    written), each yielding a payload value's JSON text, in the order the values
    come in the canonical payload. Defines ``body`` (the payload's text and digest),
    ``link``, ``event`` and ``outbox``; the caller adds its final ``SELECT``.

    A chain's first event makes its head row; when a concurrent first append made
    it first, the statement fails on ``CHAIN_HEAD_UNIQUE`` (nothing is written: the
    caller's write goes with it) and the caller writes again with ``event_append``,
    which waits its turn.
    """
    pieces = [f"%(_p{number})s::text" for number in range(len(slots) + 1)]
    text = pieces[0] + "".join(
        f" || ({expression}) || {piece}"
        for expression, piece in zip(slots, pieces[1:], strict=True)
    )
    chained = _chained_event_ctes(
        chain_of=_TASK_CHAIN,
        link_hash=_SLOTTED_HASH,
        body=True,
        on_conflict="",  # a concurrent first append fails the statement (above)
        returning="tenant_id, id, payload",
    )
    return f"""body_text AS (
    SELECT {text} AS text FROM {source}
), body AS (
    SELECT text, encode(sha256(convert_to(text, 'UTF8')), 'hex') AS digest
    FROM body_text
), {chained}, outbox AS (
    INSERT INTO audit_outbox (
        id, tenant_id, event_id, topic, key, payload, state, attempts, last_error
    )
    SELECT %(outbox_id)s, event.tenant_id, event.id, %(code)s, %(key)s,
        jsonb_set(%(envelope)s::jsonb, '{{data}}', event.payload), 'pending', 0, ''
    FROM event CROSS JOIN generic
    RETURNING id
)"""


CHAIN_HEAD_UNIQUE: Final = "audit_chainhead_chain_uniq"
SLOTTED_GENERIC: Final = _GENERIC
"""The ``generic`` CTE a slotted statement starts with (see ``_OUTBOX_FROM_EVENT``)."""


def slotted_event_params(
    *,
    tenant_id: uuid.UUID,
    code: str,
    actor: Actor,
    task_id: uuid.UUID,
    payload: Mapping[str, Any],
    slots: tuple[str, ...],
    reason: str | None = None,
    trace: Trace = NO_TRACE,
) -> dict[str, Any] | None:
    """Parameters of ``slotted_event_sql`` for an already redacted ``payload``.

    ``slots`` names the payload's top-level keys whose values the statement fills
    in, in the order their keys sort (RFC 8785 order); ``payload`` must not hold
    them. None when the payload is not one the fast path writes byte for byte as
    ``event_append`` would (a value ``portal.jcs`` hands to ``rfc8785``, or one too
    big to leave room for the slots): the caller then uses ``event_append``.
    """
    if list(slots) != sorted(slots) or set(slots) & set(payload):
        raise ValueError(f"bad slots {slots!r} for payload keys {sorted(payload)}")
    if not jcs.stdlib_agrees(payload):
        return None
    trace = trace.or_current()
    markers = {key: uuid.uuid4().hex for key in slots}
    text = chain.canonical({**payload, **markers}).decode("utf-8")
    if len(text) > settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES // 4:
        return None
    pieces = []
    for key in slots:
        before, found, text = text.partition(f'"{markers[key]}"')
        if not found:  # pragma: no cover - a string value always serialises quoted
            raise RuntimeError("slot marker missing from canonical payload")
        pieces.append(before)
    pieces.append(text)
    event_id = new_id()
    columns: dict[str, Any] = {
        "tenant_id": tenant_id,
        "task_id": task_id,
        "operation_id": None,
        "code": code,
        "actor_type": actor.type,
        "actor_id": actor.id,
        "reason_code": reason,
        "contract_key": None,
        "contract_version": None,
        "trace_id": trace.trace_id,
        "span_id": trace.span_id,
    }
    created, digest = uuid.uuid4().hex, uuid.uuid4().hex
    content = chain.canonical(
        chain.event_content(
            event_id=event_id,
            payload=None,
            payload_digest=digest,
            created_at=created,
            **columns,
        )
    )
    c0, at_created, rest = content.partition(f'"{created}"'.encode("ascii"))
    c1, at_digest, c2 = rest.partition(f'"{digest}"'.encode("ascii"))
    if not (at_created and at_digest):  # pragma: no cover - both are quoted strings
        raise RuntimeError("markers missing from canonical event content")
    envelope = json_text(
        {
            "schema_version": ENVELOPE_SCHEMA_VERSION,
            "event_id": str(event_id),
            "code": code,
            "tenant_id": str(tenant_id),
            "task_id": str(task_id),
            "operation_id": None,
            "reason_code": reason,
            "data": None,
            "trace_id": trace.trace_id,
        }
    )
    return {
        **columns,
        **{f"_p{number}": piece for number, piece in enumerate(pieces)},
        "_c0": c0 + b'"',
        "_c1": b'"' + c1 + b'"',
        "_c2": b'"' + c2,
        "id": event_id,
        "outbox_id": new_id(),
        "key": str(event_id),
        "envelope": envelope,
    }


def slotted_event_written() -> None:
    """What ``event_append`` does after its write, for a slotted event's caller."""
    if settings.PORTAL_RELAY_NUDGE:
        relay.nudge_relay()  # after commit; beat is the safety net
