from __future__ import annotations

from portal.exceptions import PortalError


class AssignmentNotFound(PortalError):
    """No routed desk item with this id in the tenant."""

    code = "NOT_FOUND"
    status = 404


class NotAGroupMember(PortalError):
    """Only a member of the item's group can take it over."""

    code = "NOT_A_GROUP_MEMBER"
    status = 403


class SetupRowInUse(PortalError):
    """A rule or an assignment still names this group; move them first."""

    code = "IN_USE"
    status = 409


class ItemClosed(PortalError):
    """This item is done (resolved or decided): it is not moved or taken any more."""

    code = "ITEM_CLOSED"
    status = 409


class AssigneeNotAllowed(PortalError):
    """That person is not in the group or may not work this tenant's desk."""

    code = "ASSIGNEE_NOT_ALLOWED"
    status = 422


class SendFailed(Exception):
    """The SMTP server or the webhook receiver did not take the message."""
