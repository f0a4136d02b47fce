"""Writes to the audit trail. ``event_append`` is the only writer of events."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Final

from django.conf import settings
from django.db import connection

from portal import db as portal_db
from portal.actors import Actor
from portal.ids import new_id
from portal.tracing import NO_TRACE, Trace

from . import chain, relay
from .redaction import redact

ENVELOPE_SCHEMA_VERSION: Final = 1

# The event with its chain link (audit/chain.py). ``audit_event_chain_head`` (migration
# 0014) locks the chain's head row (``audit_chainhead``) and reads it, and the insert's
# trigger moves the row on, so appends to one chain line up even when their callers
# hold only a share lock on the task; the partial unique indexes on ``chain_seq``
# refuse a fork within a month partition regardless. The hash is computed here
# because ``created_at`` is the database's ``now()``.
_INSERT_EVENT = f"""
INSERT INTO audit_event (
    id, tenant_id, task_id, operation_id, code, actor_type, actor_id, reason_code,
    contract_key, contract_version, payload, payload_digest, trace_id, span_id,
    created_at, chain_seq, prev_hash, hash
)
SELECT %(id)s, %(tenant_id)s, %(task_id)s, %(operation_id)s, %(code)s,
    %(actor_type)s, %(actor_id)s, %(reason_code)s, %(contract_key)s,
    %(contract_version)s, %(payload)s::jsonb, %(payload_digest)s, %(trace_id)s,
    %(span_id)s,
    now(), COALESCE(head.head_seq, 0) + 1, head.head_hash,
    encode(sha256(
        convert_to(COALESCE(head.head_hash, '{chain.GENESIS}'), 'UTF8')
        || %(content_before)s::bytea
        || convert_to({chain.CREATED_AT_SQL.format(column="now()")}, 'UTF8')
        || %(content_after)s::bytea
    ), 'hex')
FROM audit_event_chain_head(%(tenant_id)s, %(task_id)s) AS head
"""

# The event and its outbox row in one statement: one round trip on the hot paths.
#
# ``generic``: the outbox row's composite foreign key onto the partitioned
# audit_event is checked by PostgreSQL's RI trigger through a cached plan; left to
# choose, the plan cache re-plans it for every row (a custom plan looks cheaper
# than the generic one over all partitions), which cost about 1.3 ms per row with
# five partitions and 1.9 ms with 27 (docs/retention.md). A generic plan prunes the
# partitions at executor start instead. Transaction-local, like every setting here;
# for the rest of the caller's transaction every plan PostgreSQL caches (PL/pgSQL,
# RI checks, the ORM's server-side prepared statements) is generic: the hot paths'
# statements are key lookups, whose generic plan is the custom one.
_INSERT_EVENT_AND_OUTBOX = f"""
WITH generic AS (
    SELECT set_config('plan_cache_mode', 'force_generic_plan', true)
), event AS ({_INSERT_EVENT} RETURNING tenant_id, id)
INSERT INTO audit_outbox (
    id, tenant_id, event_id, topic, key, payload, state, attempts, last_error
)
SELECT %(outbox_id)s, event.tenant_id, event.id, %(code)s, %(key)s,
    %(envelope)s::jsonb, 'pending', 0, ''
FROM event CROSS JOIN generic
"""


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
    payload_json: str,
    trace_id: str,
    span_id: str,
) -> dict[str, Any]:
    """Parameters of ``_INSERT_EVENT``, including the canonical content around
    ``created_at`` that the statement hashes (audit/chain.py, format v2: the hash
    covers the payload's digest, stored beside it)."""
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
    digest = chain.payload_digest(chain.stored_payload(payload_json))
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


def json_text(value: Any) -> str:
    """Compact JSON text for a ``::jsonb`` parameter of a hand-written statement."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


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
        payload_json=json_text(payload),
        trace_id=trace.trace_id,
        span_id=trace.span_id,
    )
    with connection.cursor() as cursor:
        if not publish:
            cursor.execute(_INSERT_EVENT, params)
            return event_id
        envelope = {
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
        cursor.execute(
            _INSERT_EVENT_AND_OUTBOX,
            {
                **params,
                "outbox_id": new_id(),
                "key": str(event_id),
                "envelope": json_text(envelope),
            },
        )
    if settings.PORTAL_RELAY_NUDGE:
        relay.nudge_relay()  # after commit; beat is the safety net
    return event_id
