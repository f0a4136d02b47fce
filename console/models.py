"""Proxy models that give the people's portal its own pages over domain tables.

No table lives here: a proxy only names a second admin page for rows that
``tasks`` owns (docs/style.md R13: the takeover desk is a proxy-model admin whose only
changes are buttons calling the takeover services).
"""

from __future__ import annotations

from tasks.models import Task


class TakeoverItem(Task):
    """A task as the takeover desk shows it: one that was handed to a person."""

    class Meta:
        proxy = True
        verbose_name = "takeover desk item"
        verbose_name_plural = "takeover desk"
