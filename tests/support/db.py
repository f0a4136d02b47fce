"""The test database's clock and its privileged connections.

The tests' own connection is the app role's (tests/conftest.py). What only the owner
or a superuser may do (tamper with events, truncate, create databases) goes through
an explicit separate connection from here, never through the tests' connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dj_database_url
import psycopg
from django.conf import settings
from django.db import connection

from portal import db_roles


@contextmanager
def db_clock_offset(offset: float | str) -> Iterator[None]:
    """Move ``app_now()`` for this thread's connection (RELIABILITY.md D.2).

    Through the owner's ``portal_set_clock_offset``, which only the test suite's app
    role may execute; ``offset`` is seconds or an interval such as ``'6 minutes'``.
    """
    interval = f"{offset} seconds" if isinstance(offset, (int, float)) else offset
    with connection.cursor() as cursor:
        cursor.execute("SELECT portal_set_clock_offset(%s::interval)", [interval])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT portal_reset_clock_offset()")


def conninfo(*, user: str | None = None, dbname: str | None = None) -> dict[str, Any]:
    """psycopg parameters for the test database as ``user`` (the administrator's
    role of DATABASE_URL by default)."""
    admin = dj_database_url.parse(settings.DATABASE_URL)
    return {
        "host": admin.get("HOST") or "127.0.0.1",
        "port": int(admin.get("PORT") or 5432),
        "user": user or admin.get("USER"),
        "password": None if user else admin.get("PASSWORD") or None,
        "dbname": dbname or connection.settings_dict["NAME"],
    }


def connect_as(role: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A separate connection to the test database as ``role`` (``"owner"``,
    ``"app"`` or ``"admin"``, the superuser of DATABASE_URL)."""
    user = {"owner": db_roles.OWNER_ROLE, "app": db_roles.APP_ROLE, "admin": None}[role]
    return psycopg.connect(**conninfo(user=user), **kwargs)
