"""Errors of the limits (docs/style.md R12: each app's in its exceptions.py)."""

from __future__ import annotations

from portal.exceptions import NotFound


class AgentNotFound(NotFound):
    """No such agent in this tenant."""
