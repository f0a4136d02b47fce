"""Events written at a chosen time, chained as ``event_append`` chains them.

``event_append`` stamps the database's ``now()``; retention works on months gone by,
so its tests write events with a UUIDv7 id and ``created_at`` of another time (a
``gen_random_uuid()`` id belongs to no month partition). Like ``event_append``, a
hand-written event moves its chain's head row (``audit_chainhead``) itself:
``chain_head_locked`` and ``chain_head_moved``.
"""

from __future__ import annotations

import datetime as dt
import uuid

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from audit import chain
from audit import services as audit_services
from audit.models import EventCode
from portal import ids
from portal.models import Tenant


def append_at(
    tenant: Tenant,
    task_id: uuid.UUID | None,
    when: dt.datetime,
    n: int,
    *,
    v1: bool = False,
) -> uuid.UUID:
    """An event written at ``when``, chained as event_append chains (formats v1/v2)."""
    payload = {"n": n, "note": f"fact {n}"}
    event_id = ids.id_at(when)
    created = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    code = EventCode.TASK_TRANSITIONED if task_id else EventCode.TENANT_CHANGED
    digest = None if v1 else chain.payload_digest(payload)
    with transaction.atomic(), connection.cursor() as cursor:
        seq, prev = chain_head_locked(cursor, tenant.pk, task_id)
        content = chain.event_content(
            event_id=event_id, tenant_id=tenant.pk, task_id=task_id,
            operation_id=None, code=code, actor_type="system",
            actor_id="retention-test", reason_code=None, contract_key=None,
            contract_version=None, payload=payload, payload_digest=digest,
            trace_id="", span_id="", created_at=created,
        )  # fmt: skip
        event_hash = chain.event_hash(prev_hash=prev, content=content)
        cursor.execute(
            "INSERT INTO audit_event (id, tenant_id, task_id, code, actor_type,"
            " actor_id, payload, payload_digest, trace_id, span_id, created_at,"
            " chain_seq, prev_hash, hash)"
            " VALUES (%s, %s, %s, %s, 'system', 'retention-test', %s::jsonb, %s,"
            " '', '', %s, %s, %s, %s)",
            [
                event_id, tenant.pk, task_id, code, audit_services.json_text(payload),
                digest, when, seq + 1, prev, event_hash,
            ],
        )  # fmt: skip
        chain_head_moved(cursor, tenant.pk, task_id, seq + 1, event_id, event_hash)
    return event_id


def chain_head_locked(
    cursor: CursorWrapper, tenant_id: uuid.UUID, task_id: uuid.UUID | None
) -> tuple[int, str | None]:
    """The chain's head (``head_seq``, ``head_hash``; 0 and None for a new chain),
    its row made if missing and locked until commit."""
    cursor.execute(
        "INSERT INTO audit_chainhead (tenant_id, task_id, head_seq)"
        " VALUES (%s, %s, 0) ON CONFLICT (tenant_id, task_id) DO NOTHING",
        [tenant_id, task_id],
    )
    cursor.execute(
        "SELECT head_seq, head_hash FROM audit_chainhead"
        " WHERE tenant_id = %s AND task_id IS NOT DISTINCT FROM %s FOR UPDATE",
        [tenant_id, task_id],
    )
    seq, prev = cursor.fetchone()
    return int(seq), prev


def chain_head_moved(
    cursor: CursorWrapper,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID | None,
    seq: int,
    event_id: uuid.UUID,
    event_hash: str,
) -> None:
    """Move the chain's head row to the event just written by hand."""
    cursor.execute(
        "UPDATE audit_chainhead SET head_seq = %s, head_event_id = %s,"
        " prev_hash = head_hash, head_hash = %s"
        " WHERE tenant_id = %s AND task_id IS NOT DISTINCT FROM %s",
        [seq, event_id, event_hash, tenant_id, task_id],
    )
