"""A small ``load_scale_data`` database of a bench smoke test's own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import psycopg
from django.conf import settings

from bench.service_layer import recreate_database
from portal import db_roles

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def small_scale_database(name: str) -> Iterator[str]:
    """An administrator's URL of a migrated database named after the test database
    and ``name``, holding 200 tasks and 2,000 events over two tenants; dropped
    after."""
    # recreate_database drops only a database whose name says "bench".
    database = f"{settings.DATABASES['default']['TEST']['NAME']}_bench_{name}"
    url = urllib.parse.urlsplit(settings.DATABASE_URL)._replace(path=f"/{database}")
    try:
        app_url = recreate_database(url.geturl())
        subprocess.run(
            [sys.executable, "manage.py", "load_scale_data", "--tasks", "200",
             "--events", "2000", "--tenants", "2", "--verbosity", "0"],
            cwd=REPO, check=True, capture_output=True, timeout=300,
            env={**os.environ, "DATABASE_URL": app_url, "PORTAL_NO_BOOTSTRAP": "1",
                 "DATABASE_OWNER_URL": db_roles.url_as(
                     url.geturl(), user=db_roles.OWNER_ROLE)},
        )  # fmt: skip
        yield url.geturl()
    finally:
        admin = psycopg.conninfo.make_conninfo(settings.DATABASE_URL, dbname="postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
