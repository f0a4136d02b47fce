"""Databases of the bench smoke tests' own: named after the test database, dropped
after each test (the benches drop and re-create only a database whose name says
"bench")."""

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
def bench_databases(*names: str) -> Iterator[list[str]]:
    """Administrator URLs of ``<test database>_bench_<name>``, one per name, for a
    bench to make; each dropped after, whether or not the bench made it."""
    prefix = f"{settings.DATABASES['default']['TEST']['NAME']}_bench_"
    base = urllib.parse.urlsplit(settings.DATABASE_URL)
    databases = [prefix + name for name in names]
    try:
        yield [base._replace(path=f"/{database}").geturl() for database in databases]
    finally:
        admin = psycopg.conninfo.make_conninfo(settings.DATABASE_URL, dbname="postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            for database in databases:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@contextlib.contextmanager
def small_scale_database(name: str) -> Iterator[str]:
    """``bench_databases(name)``'s URL, migrated, holding 200 tasks and 2,000
    events over two tenants (``manage.py load_scale_data``)."""
    with bench_databases(name) as (url,):
        app_url = recreate_database(url)
        subprocess.run(
            [sys.executable, "manage.py", "load_scale_data", "--tasks", "200",
             "--events", "2000", "--tenants", "2", "--verbosity", "0"],
            cwd=REPO, check=True, capture_output=True, timeout=300,
            env={**os.environ, "DATABASE_URL": app_url, "PORTAL_NO_BOOTSTRAP": "1",
                 "DATABASE_OWNER_URL": db_roles.url_as(
                     url, user=db_roles.OWNER_ROLE)},
        )  # fmt: skip
        yield url
