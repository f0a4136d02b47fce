"""Django's PostgreSQL backend; each transaction starts with the tenant scope set.

``portal/scope.py`` holds the scope. Django turns autocommit off when the outermost
``atomic`` block begins: that is where the transaction-local setting is made. Under a
scope, ``BEGIN`` and the setting go to the server as one simple query, one round trip
instead of two: psycopg stays in its autocommit mode, so it sends no ``BEGIN`` of its
own, and its ``commit()``/``rollback()`` follow the server's transaction status, which
``BEGIN`` set. Without a scope psycopg begins the transaction itself, as Django's
backend always has. Autocommit statements under a scope are wrapped in a transaction
of their own (``scope.scoped_statement``).

One thing this does not carry: Django's manual transaction management
(``transaction.set_autocommit(False)``, then ``commit()`` and more statements). Under
a scope, psycopg would not begin the next transaction after that ``commit()`` by
itself. The portal never manages transactions by hand; ``atomic`` is the one way.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus

from portal import scope


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute_wrappers.append(scope.scoped_statement)

    def _set_autocommit(self, autocommit: bool) -> None:
        if autocommit or scope.current() is None:
            super()._set_autocommit(autocommit)  # type: ignore[misc]
            return
        raw = self.connection
        with self.wrap_database_errors:
            if not raw.autocommit:  # left so by an unscoped transaction
                raw.autocommit = True
            raw.execute(scope.begin_statement(raw), prepare=False)

    def set_autocommit(
        self,
        autocommit: bool,
        force_begin_transaction_with_broken_autocommit: bool = False,
    ) -> None:
        """Django's, except that a dropped connection is not reopened only to be
        told "autocommit on", the state a new connection starts in anyway.

        When the connection is lost inside ``atomic`` (a partition: keepalives and
        ``tcp_user_timeout`` end the wait, config/settings.py), the block's rollback
        fails, Django drops the connection and then, leaving the block, turns
        autocommit back on, which opens a new connection first. Across the same
        partition that connect waits ``connect_timeout`` or ``tcp_user_timeout``
        again before the request can answer its 503 (6 s instead of 3 in
        tests/http/test_db_partition.py). The next statement connects as before.
        """
        if autocommit and self.connection is None and self.settings_dict["AUTOCOMMIT"]:
            self.validate_no_atomic_block()
            # close() discarded the on-commit hooks with the transaction.
            self.run_commit_hooks_on_set_autocommit_on = False
            self.autocommit = True
            return
        super().set_autocommit(
            autocommit,
            force_begin_transaction_with_broken_autocommit=(
                force_begin_transaction_with_broken_autocommit
            ),
        )

    def is_usable(self) -> bool:
        """Whether the kept connection can serve the next request, without a round
        trip when it is idle.

        ``CONN_HEALTH_CHECKS`` asks this at the first query of every request;
        Django's answer sends ``SELECT 1``, one more round trip per request (issue
        23). An idle connection has nothing to read unless the server ended it: a
        terminated backend, a restart or a shutdown sends its FATAL message and
        closes the socket, which then reads as ready. So an idle connection is
        usable when psycopg holds it open and its socket has nothing waiting;
        anything else asks the server as Django does.
        """
        raw = self.connection
        if raw is None or raw.closed or raw.broken:
            return False
        if raw.info.transaction_status != TransactionStatus.IDLE:
            usable: bool = super().is_usable()
            return usable
        try:
            waiting, _, _ = select.select([raw.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return not waiting

    def create_cursor(self, name: str | None = None) -> Any:
        # Django gives a named (server-side) cursor WITH HOLD when psycopg is in
        # autocommit mode; inside a scoped transaction psycopg is in that mode too,
        # but the cursor lives in the transaction, as in any other.
        if name is None or self.get_autocommit():
            return super().create_cursor(name)
        cursor = super().create_cursor(name)
        cursor._withhold = False
        return cursor
