"""Events written at a chosen time, chained as ``event_append`` chains them.

``event_append`` stamps the database's ``now()``; retention works on months gone by,
so its tests write events with a UUIDv7 id and ``created_at`` of another time (a
``gen_random_uuid()`` id belongs to no month partition).
"""

from __future__ import annotations

import datetime as dt
import uuid

from django.db import connection, transaction

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
        cursor.execute(
            "SELECT head_seq, head_hash FROM audit_event_chain_head(%s, %s)",
            [tenant.pk, task_id],
        )
        seq, prev = cursor.fetchone()
        content = chain.event_content(
            event_id=event_id, tenant_id=tenant.pk, task_id=task_id,
            operation_id=None, code=code, actor_type="system",
            actor_id="retention-test", reason_code=None, contract_key=None,
            contract_version=None, payload=payload, payload_digest=digest,
            trace_id="", span_id="", created_at=created,
        )  # fmt: skip
        cursor.execute(
            "INSERT INTO audit_event (id, tenant_id, task_id, code, actor_type,"
            " actor_id, payload, payload_digest, trace_id, span_id, created_at,"
            " chain_seq, prev_hash, hash)"
            " VALUES (%s, %s, %s, %s, 'system', 'retention-test', %s::jsonb, %s,"
            " '', '', %s, %s, %s, %s)",
            [
                event_id, tenant.pk, task_id, code, audit_services.json_text(payload),
                digest, when, (seq or 0) + 1, prev,
                chain.event_hash(prev_hash=prev, content=content),
            ],
        )  # fmt: skip
    return event_id
