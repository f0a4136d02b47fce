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
