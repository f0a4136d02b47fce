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
        "audit_event_payload_size_check": EventPayloadTooLarge,
    }
)


class TenantAlreadyDeleted(PortalError):
    """This tenant was already deleted; only its tombstone and kept events remain."""

    code = "TENANT_ALREADY_DELETED"
    status = 409


class TenantDeletionPolicyIncomplete(PortalError):
    """A tenant-owned table is missing from the tenant deletion policy.

    If you're hitting this, a model with a foreign key to ``Tenant`` was added without
    a place in ``DELETION_ORDER`` in ``audit/retention.py``. Add it there (children
    before parents) and to docs/tenant-deletion.md. Nothing was deleted.
    """

    code = "TENANT_DELETION_POLICY_INCOMPLETE"
