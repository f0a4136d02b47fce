"""A multi-host ``DATABASE_URL`` (libpq's, for a Patroni cluster; issue 26) reaches
Django and the role helpers whole: every host and port, and
``target_session_attrs`` (portal/database_url.py)."""

from __future__ import annotations

import json

import dj_database_url
import pytest

from portal import database_url, db_roles
from tests.support.fresh_python import run_fresh_python

HA_URL = (
    "postgres://portal_app@10.0.0.1:5433,10.0.0.2,[fd00::3]:6000/portal"
    "?target_session_attrs=read-write&application_name=portal-web"
)


def test_a_multi_host_url_gives_libpq_its_host_and_port_lists():
    config = database_url.parse(HA_URL, conn_max_age=60)
    assert config["HOST"] == "10.0.0.1,10.0.0.2,fd00::3"
    assert config["PORT"] == "5433,5432,6000"  # the default said where none is
    assert config["USER"] == "portal_app"
    assert config["NAME"] == "portal"
    assert config["CONN_MAX_AGE"] == 60
    assert config["OPTIONS"] == {
        "target_session_attrs": "read-write",
        "application_name": "portal-web",
    }


def test_a_one_host_url_is_dj_database_urls_own_answer():
    url = "postgres://u:p@db.example:6543/portal?sslmode=require"
    assert database_url.parse(url) == dict(dj_database_url.parse(url))
    assert not database_url.is_multi_host(url)


def test_a_broken_host_list_is_refused():
    with pytest.raises(dj_database_url.ParseError):
        database_url.parse("postgres://u@h1:5432,:5433/portal")
    with pytest.raises(dj_database_url.ParseError):
        database_url.parse("postgres://u@h1:5432,h2:port/portal")


def test_the_role_helpers_keep_every_host():
    owner = db_roles.url_as(HA_URL, user=db_roles.OWNER_ROLE)
    assert owner == (
        "postgres://portal_owner@10.0.0.1:5433,10.0.0.2,[fd00::3]:6000/portal"
        "?target_session_attrs=read-write&application_name=portal-web"
    )
    info = db_roles._conninfo(owner, dbname="postgres")
    assert info["host"] == "10.0.0.1,10.0.0.2,fd00::3"
    assert info["port"] == "5433,5432,6000"
    assert info["user"] == db_roles.OWNER_ROLE
    assert info["dbname"] == "postgres"
    assert info["target_session_attrs"] == "read-write"


def test_the_settings_pass_the_lists_and_the_query_to_the_connection():
    # Settings load once per process: a fresh interpreter with the HA URL.
    code = (
        "import django, json; django.setup(); from django.conf import settings;"
        "d = settings.DATABASES['default'];"
        "print(json.dumps([d['HOST'], d['PORT'], d['OPTIONS']]))"
    )
    done = run_fresh_python(
        ["-c", code],
        drop=("PORTAL_DB_CONNECT_TIMEOUT_S",),  # the default, 5 s
        DATABASE_URL=HA_URL,
        PORTAL_DEV_MODE="1",
    )
    assert done.returncode == 0, done.stderr
    host, port, options = json.loads(done.stdout.strip().splitlines()[-1])
    assert host == "10.0.0.1,10.0.0.2,fd00::3"
    assert port == "5433,5432,6000"
    assert options["target_session_attrs"] == "read-write"
    assert options["application_name"] == "portal-web"
    # the portal's own connection options are still there (connect_timeout bounds
    # the wait on each host of the list)
    assert "lock_timeout" in options["options"]
    assert options["connect_timeout"] == 5
