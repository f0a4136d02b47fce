"""Reads of the kill switch and the limits (docs/limits.md)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection

from portal import db as portal_db
from portal.codes import ReasonCode
from portal.models import Tenant

# FOR SHARE: a freeze (an UPDATE of either row) waits until the transaction that
# read the flags commits, and one that starts after the freeze committed sees them.
_FROZEN = """
SELECT a.frozen_at IS NOT NULL, t.frozen_at IS NOT NULL
FROM portal_agent a JOIN portal_tenant t ON t.id = a.tenant_id
WHERE a.tenant_id = %s AND a.id = %s
FOR SHARE OF a, t
"""
_TENANT_FROZEN = (
    "SELECT frozen_at IS NOT NULL FROM portal_tenant WHERE id = %s FOR SHARE"
)


def frozen_reason(
    *, tenant: Tenant, agent_id: uuid.UUID | str | None
) -> ReasonCode | None:
    """``AGENT_FROZEN``, ``TENANT_FROZEN`` or None, read under a share lock held
    until the caller's transaction ends (no agent: the tenant's flag alone).

    Raises:
        TransactionRequired: no transaction is open (the lock would not hold).
    """
    portal_db.require_transaction()
    with connection.cursor() as cursor:
        if agent_id is None:
            cursor.execute(_TENANT_FROZEN, [tenant.pk])
            row: Any = cursor.fetchone()
            return ReasonCode.TENANT_FROZEN if row and row[0] else None
        cursor.execute(_FROZEN, [tenant.pk, str(agent_id)])
        row = cursor.fetchone()
    if row is None:
        return None
    if row[0]:
        return ReasonCode.AGENT_FROZEN
    return ReasonCode.TENANT_FROZEN if row[1] else None
