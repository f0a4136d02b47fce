"""A paginator for tables of millions of rows: it never counts them all."""

from __future__ import annotations

from typing import Final

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

# Ten pages of a hundred rows. The count reads every row it counts, heap and all
# (a list's filters are not an index's), so the cap is the page's cost: 10,000 made
# the count of the task and operation lists of the largest tenant of the 10M-event
# data set most of their time (docs/performance-log.md, issue 23's admin pages).
COUNT_CAP: Final = 1_000


class CappedPaginator(Paginator):
    """Counts at most ``COUNT_CAP`` rows (``COUNT(*)`` over a ``LIMIT`` subquery).

    Past the cap the list says "1000+" (``more_than_counted``; the admin's
    pagination template) and offers that many rows' pages; a filter, a search or a
    time range narrows the selection (an export takes all of it).
    """

    cap: int = COUNT_CAP

    @cached_property
    def _counted(self) -> int:
        """Rows counted, up to one past the cap."""
        rows = self.object_list
        if isinstance(rows, QuerySet):
            return rows[: self.cap + 1].count()
        return len(rows)

    @cached_property
    def count(self) -> int:
        if isinstance(self.object_list, QuerySet):
            return min(self._counted, self.cap)
        return self._counted

    @property
    def more_than_counted(self) -> bool:
        """The selection holds more rows than ``count`` says."""
        return isinstance(self.object_list, QuerySet) and self._counted > self.cap
