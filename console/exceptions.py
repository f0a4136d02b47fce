"""Errors of the people's portal itself."""

from __future__ import annotations

from portal.exceptions import PortalError, ValidationFailed


class TooManySavedSearches(ValidationFailed):
    """You have the most saved searches one person may keep; delete one first."""

    code = "SAVED_SEARCH_LIMIT"


class FormAlreadyUsed(ValidationFailed):
    """This form was sent already, and nothing was made again. Reload the page
    to use it once more."""

    code = "FORM_ALREADY_USED"
    status = 409


class FormExpired(ValidationFailed):
    """This page is too old (or not from this portal) to act on; nothing was made.
    Reload it and try again."""

    code = "FORM_EXPIRED"


class LastAdministrator(PortalError):
    """A tenant keeps at least one administrator; add another before this change."""

    code = "LAST_ADMINISTRATOR"
    status = 409


class InvitationNotFound(PortalError):
    """This invitation link is not valid. Check that it was copied whole, or ask
    the administrator who invited you for a new one."""

    code = "INVITATION_NOT_FOUND"
    status = 404


class InvitationUsed(PortalError):
    """This invitation was accepted already; each link works once. Sign in, or ask
    the administrator for a new invitation."""

    code = "INVITATION_USED"
    status = 410


class InvitationExpired(PortalError):
    """This invitation has expired. Ask the administrator who invited you to invite
    you again."""

    code = "INVITATION_EXPIRED"
    status = 410


class InvitationWithdrawn(PortalError):
    """The person who sent this invitation no longer administers the tenant, so it
    no longer holds. Ask a tenant administrator for a new one."""

    code = "INVITATION_WITHDRAWN"
    status = 410


class InvitationNotSent(PortalError):
    """The invitation is stored but its e-mail could not be sent; invite the address
    again to send a new link."""

    code = "INVITATION_NOT_SENT"
    status = 502
    retryable = True
