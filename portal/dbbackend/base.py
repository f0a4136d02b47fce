"""Django's PostgreSQL backend; each transaction starts with the tenant scope set.

``portal/scope.py`` holds the scope. Django turns autocommit off when the outermost
``atomic`` block begins: that is where the transaction-local setting is made, as the
transaction's first statement. Autocommit statements under a scope are wrapped in a
transaction of their own (``scope.scoped_statement``).
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from portal import scope


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute_wrappers.append(scope.scoped_statement)

    def _set_autocommit(self, autocommit: bool) -> None:
        super()._set_autocommit(autocommit)  # type: ignore[misc]
        if not autocommit and scope.current() is not None:
            scope.apply(self)
