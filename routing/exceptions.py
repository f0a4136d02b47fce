from __future__ import annotations

from portal.exceptions import PortalError


class AssignmentNotFound(PortalError):
    """No routed desk item with this id in the tenant."""

    code = "NOT_FOUND"
    status = 404


class NotAGroupMember(PortalError):
    """Only a member of the item's group (or the backup group) can take it over."""

    code = "NOT_A_GROUP_MEMBER"
    status = 403


class SetupRowInUse(PortalError):
    """A rule or an assignment still names this group; move them first."""

    code = "IN_USE"
    status = 409
