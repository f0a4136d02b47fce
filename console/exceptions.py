"""Errors of the people's portal itself."""

from __future__ import annotations

from portal.exceptions import ValidationFailed


class TooManySavedSearches(ValidationFailed):
    """You have the most saved searches one person may keep; delete one first."""

    code = "SAVED_SEARCH_LIMIT"
