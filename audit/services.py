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

from . import relay
from .redaction import redact_payload

ENVELOPE_SCHEMA_VERSION: Final = 1

_INSERT_EVENT = """
INSERT INTO audit_event (
    id, tenant_id, task_id, operation_id, code, actor_type, actor_id, reason_code,
    contract_key, contract_version, payload, trace_id, span_id
) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s)
"""

# The event and its outbox row in one statement: one round trip on the hot paths.
_INSERT_EVENT_AND_OUTBOX = f"""
WITH event AS ({_INSERT_EVENT} RETURNING tenant_id, id)
INSERT INTO audit_outbox (
    id, tenant_id, event_id, topic, key, payload, state, attempts, last_error
)
SELECT %s, event.tenant_id, event.id, %s, %s, %s::jsonb, 'pending', 0, ''
FROM event
"""


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

    Guarantee: the payload is redacted and bounded before it is written; the event and
    its outbox row commit or roll back with the caller's state change.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    payload = redact_payload(data or {})
    event_id = new_id()
    contract_key, contract_version = contract if contract else (None, None)
    event_params: list[Any] = [
        event_id,
        tenant_id,
        task_id,
        operation_id,
        code,
        actor.type,
        actor.id,
        reason,
        contract_key,
        contract_version,
        json_text(payload),
        trace.trace_id,
        trace.span_id,
    ]
    with connection.cursor() as cursor:
        if not publish:
            cursor.execute(_INSERT_EVENT, event_params)
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
            [*event_params, new_id(), code, str(event_id), json_text(envelope)],
        )
    if settings.PORTAL_RELAY_NUDGE:
        relay.nudge_relay()  # after commit; beat is the safety net
    return event_id
