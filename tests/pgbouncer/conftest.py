"""The portal behind a PgBouncer of the test's own, in transaction pooling mode.

``bouncer`` runs one PgBouncer (tests/support/pgbouncer.py) per module in front of
the test database, configured as docs/operations.md says; ``through_bouncer``
points this process's Django connections at it for one test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import dj_database_url
import pytest
from django.conf import settings
from django.db import connection

from portal import db_roles
from tests.support import pgbouncer
from tests.support.broker import amqp_url  # noqa: F401 (the fixture)
from tests.support.pgbouncer import PgBouncer

MISSING = pgbouncer.version() is None
if MISSING and not os.environ.get("CI"):
    pytest.skip(
        "pgbouncer is not installed (.ci/run installs Debian's package)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module", autouse=True)
def pgbouncer_installed() -> None:
    """Under CI a missing PgBouncer fails each test here instead of skipping it
    (before any other fixture of the module tries to start it)."""
    if MISSING:
        pytest.fail(
            "pgbouncer is missing; .ci/run installs it (apt-get install pgbouncer)"
        )


def portal_options() -> dict[str, Any]:
    """The OPTIONS the portal's settings give its database connection."""
    return dict(settings.DATABASES["default"]["OPTIONS"])


def bouncer_settings() -> dict[str, str]:
    """The environment the portal needs behind this PgBouncer (docs/operations.md):
    server-side binding off where PgBouncer cannot keep prepared statements."""
    if pgbouncer.keeps_prepared_statements():
        return {}
    return {"PORTAL_DB_SERVER_SIDE_BINDING": "0"}


def start(**overrides: Any) -> Any:
    """A PgBouncer in front of the test database, as docs/operations.md sets it."""
    params = connection.settings_dict
    admin_user = dj_database_url.parse(settings.DATABASE_URL)["USER"] or "postgres"
    arguments: dict[str, Any] = {
        "upstream": (params.get("HOST") or "127.0.0.1", int(params.get("PORT") or 5432)),
        "databases": [params["NAME"]],
        "users": [admin_user, db_roles.APP_ROLE, db_roles.OWNER_ROLE],
        "pool_size": 2,
        "connect_query": pgbouncer.startup_timeouts(portal_options()["options"]),
    }
    arguments.update(overrides)
    return pgbouncer.running_pgbouncer(**arguments)


@pytest.fixture(scope="module")
def bouncer(django_db_setup: None, django_db_blocker: Any) -> Iterator[PgBouncer]:
    with django_db_blocker.unblock(), start() as running:
        yield running


@pytest.fixture
def through_bouncer(
    transactional_db: None, bouncer: PgBouncer
) -> Iterator[PgBouncer]:
    """Every new Django connection of this process (any thread) goes through
    ``bouncer`` for the test, with the OPTIONS the documented settings give."""
    params = connection.settings_dict  # shared by every thread's connection
    saved = {key: params[key] for key in ("HOST", "PORT", "OPTIONS")}
    options = dict(params["OPTIONS"])
    if "PORTAL_DB_SERVER_SIDE_BINDING" in bouncer_settings():
        options["server_side_binding"] = False
    connection.close()
    params.update(HOST="127.0.0.1", PORT=bouncer.port, OPTIONS=options)
    try:
        yield bouncer
    finally:
        connection.close()
        params.update(saved)
