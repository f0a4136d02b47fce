"""Keyset pages over ``(updated_at, id)``: "next" from the last row; no OFFSET, COUNT.

Used by the takeover queue in the API and in the admin desk; a page costs the same
whether it is the first or the thousandth.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any, Final

from django.db.models import Q, QuerySet

from .exceptions import InvalidCursor
from .models import Task

DEFAULT_PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 200


# --- keyset pages --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Cursor:
    """Where a page ends: the last row's ``updated_at`` and ``id``."""

    updated_at: dt.datetime
    id: uuid.UUID

    def encode(self) -> str:
        raw = json.dumps([self.updated_at.isoformat(), str(self.id)])
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor a "next" link carries.

        Raises:
            InvalidCursor: not one this module wrote (hand-edited or truncated).
        """
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            stamp, pk = json.loads(raw)
            updated_at = dt.datetime.fromisoformat(stamp)
            if updated_at.tzinfo is None:
                raise ValueError("naive time")
            return cls(updated_at=updated_at, id=uuid.UUID(pk))
        except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
            raise InvalidCursor(field="after") from None

    @classmethod
    def of(cls, task: Task) -> Cursor:
        return cls(updated_at=task.updated_at, id=task.pk)


@dataclass(frozen=True, kw_only=True)
class KeysetPage:
    items: list[Any]
    next_cursor: Cursor | None


def keyset_order(*, newest_first: bool) -> tuple[str, str]:
    return ("-updated_at", "-id") if newest_first else ("updated_at", "id")


def keyset_page(
    queryset: QuerySet[Any],
    *,
    newest_first: bool,
    after: Cursor | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
) -> KeysetPage:
    """One page of ``queryset`` in ``(updated_at, id)`` order, after ``after``.

    Fetches ``limit + 1`` rows to learn whether there is a next page; no COUNT.
    A row whose ``updated_at`` changes while someone pages (a claim, a release)
    moves to its new place in the order: it may be seen twice or skipped once.
    """
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    if after is not None:
        if newest_first:
            beyond = Q(updated_at__lt=after.updated_at) | Q(
                updated_at=after.updated_at, id__lt=after.id
            )
        else:
            beyond = Q(updated_at__gt=after.updated_at) | Q(
                updated_at=after.updated_at, id__gt=after.id
            )
        queryset = queryset.filter(beyond)
    rows = list(
        queryset.order_by(*keyset_order(newest_first=newest_first))[: limit + 1]
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return KeysetPage(items=rows, next_cursor=Cursor.of(rows[-1]) if more else None)
