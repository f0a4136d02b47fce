"""Databases of the deployment tests: new ones on the test run's PostgreSQL server,
owned by portal_owner as README "Database roles" makes them, and manage.py runs."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import dj_database_url
import psycopg
from django.conf import settings
from psycopg import sql

from portal import db_roles
from tests.deploy.units import REPO


def admin_params() -> dict[str, Any]:
    """The administrator's connection (DATABASE_URL of the test run)."""
    db = dj_database_url.parse(settings.DATABASE_URL)
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": int(db["PORT"] or 5432),
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
    }


def url(database: str, *, role: str) -> str:
    """A URL of ``database`` as ``role`` (no password: the server trusts 127.0.0.1)."""
    admin = admin_params()
    return f"postgres://{role}@{admin['host']}:{admin['port']}/{database}"


def create_database(name: str) -> None:
    db_roles.ensure_roles(settings.DATABASE_URL)
    with psycopg.connect(dbname="postgres", autocommit=True, **admin_params()) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(db_roles.OWNER_ROLE)
            )
        )


def drop_database(name: str) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True, **admin_params()) as conn:
        # FORCE: a killed process may leave a session behind.
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )


def manage(
    env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``manage.py args`` in the checkout with exactly ``env`` (no bootstrap)."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env={**env, "PORTAL_NO_BOOTSTRAP": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
