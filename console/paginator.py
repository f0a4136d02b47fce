"""A paginator for tables of millions of rows: it never counts them all."""

from __future__ import annotations

from typing import Final

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

COUNT_CAP: Final = 10_000


class CappedPaginator(Paginator):
    """Counts at most ``COUNT_CAP`` rows (``COUNT(*)`` over a ``LIMIT`` subquery).

    Past the cap the list says "10000" and offers that many rows' pages; a filter or
    a time range narrows the selection (an export takes all of it).
    """

    cap: int = COUNT_CAP

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if isinstance(rows, QuerySet):
            return min(rows[: self.cap + 1].count(), self.cap)
        return len(rows)
