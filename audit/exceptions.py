"""Errors of the audit trail."""

from __future__ import annotations

from portal import db as portal_db
from portal.exceptions import PortalError


class AuditTrailImmutable(PortalError):
    """Audit events are append-only: they cannot be changed or deleted."""

    code = "AUDIT_IMMUTABLE"
    status = 409


class EventPayloadTooLarge(PortalError):
    """The event payload is over the size bound."""

    code = "EVENT_PAYLOAD_TOO_LARGE"
    status = 413


portal_db.register_constraint_errors(
    {
        "audit_event_append_only_trg": AuditTrailImmutable,
        "audit_retention_append_only_trg": AuditTrailImmutable,
        "audit_event_payload_size_check": EventPayloadTooLarge,
    }
)
