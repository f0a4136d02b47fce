"""Errors of tenant deletion."""

from __future__ import annotations

from portal.exceptions import PortalError


class TenantAlreadyDeleted(PortalError):
    """This tenant was already deleted; only its tombstone and kept events remain."""

    code = "TENANT_ALREADY_DELETED"
    status = 409


class TenantDeletionPolicyIncomplete(PortalError):
    """A tenant-owned table is missing from the tenant deletion policy.

    If you're hitting this, a model with a foreign key to ``Tenant`` was added without
    a place in ``DELETION_ORDER`` in ``tenant_deletion/services.py``. Add it there
    (children before parents) and to docs/tenant-deletion.md. Nothing was deleted.
    """

    code = "TENANT_DELETION_POLICY_INCOMPLETE"
