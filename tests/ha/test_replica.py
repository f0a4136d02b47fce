"""Reviewers on a replica (issue 26 §3, portal/replica.py).

The tier's gunicorn has ``PORTAL_REPLICA_DATABASE_URL`` (``prefer-standby``). A
reviewer's export opens the web's first connection to the standby (none before) and
its record (``audit.exported``) is written on the primary; the event history says
the replica is caught up. The rows come through row-level security on the standby
(with no scope the app role sees no rows there), and another tenant's person sees
none of the demo tenant's.
"""

from __future__ import annotations

import csv
import io
import re

import httpx
import psycopg
import pytest

from portal import db_roles
from tests.support import ha

from .conftest import DBNAME, HAPortal

pytestmark = pytest.mark.slow

REVIEWER = ("reviewer", "reviewer-demo-password")  # seed_demo's
OTHER = ("replica-other-admin", "replica-other-password-7d1e")
LAG = re.compile(r'<p id="replica-lag"[^>]*data-caught-up="(\w+)"[^>]*>\s*([^<]*)')


def _login(base_url: str, username: str, password: str) -> httpx.Client:
    http = httpx.Client(base_url=base_url, trust_env=False, timeout=60)
    http.get("/admin/login/")
    done = http.post(
        "/admin/login/?next=/admin/",
        data={
            "csrfmiddlewaretoken": http.cookies["csrftoken"],
            "username": username,
            "password": password,
            "next": "/admin/",
        },
        headers={"Referer": f"{base_url}/admin/login/"},
        follow_redirects=True,
    )
    assert done.status_code == 200 and done.url.path == "/admin/", username
    return http


def _export(http: httpx.Client) -> list[dict[str, str]]:
    answer = http.get("/admin/audit/event/export/csv/")
    assert answer.status_code == 200, answer.text[:500]
    return list(csv.DictReader(io.StringIO(answer.text)))


def _lag(http: httpx.Client) -> tuple[str, str]:
    page = http.get("/admin/audit/event/")
    assert page.status_code == 200
    found = LAG.search(page.text)
    assert found, page.text[:2000]
    return found[1], " ".join(found[2].split())


def _exported(conninfo: str, tenant_id: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as db:
        row = db.execute(
            "SELECT count(*) FROM audit_event WHERE tenant_id = %s"
            " AND code = 'audit.exported'",
            [tenant_id],
        ).fetchone()
    assert row is not None
    return int(row[0])


def _web_connections(conninfo: str) -> int:
    """The app role's connections to the portal's database on a node (the web's)."""
    with psycopg.connect(conninfo, autocommit=True) as db:
        row = db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s"
            " AND datname = %s AND pid <> pg_backend_pid()",
            [db_roles.APP_ROLE, DBNAME],
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_reviewers_read_on_the_standby_under_row_level_security(
    ha_portal: HAPortal,
) -> None:
    cluster = ha_portal.cluster
    leader = cluster.wait_for_leader()
    (standby,) = [node for node in cluster.nodes if node.name != leader]
    cluster.wait_for_sync_standby(standby.name)
    primary_db = cluster.node(leader).conninfo(dbname=DBNAME)
    standby_db = standby.conninfo(dbname=DBNAME)
    with psycopg.connect(primary_db) as db:
        row = db.execute("SELECT id FROM portal_tenant WHERE slug = 'demo'").fetchone()
    assert row is not None
    demo = str(row[0])
    # Another tenant and its administrator, on the primary.
    ha.manage(
        cluster,
        "tenant_create",
        "replica-other",
        "--name",
        "Other",
        "--admin",
        OTHER[0],
        "--password-from-env",
        "OTHER_PASSWORD",
        database_url=ha_portal.app_url,
        env={"OTHER_PASSWORD": OTHER[1]},
    )
    base = ha_portal.web.base_url
    reviewer = _login(base, *REVIEWER)
    other = _login(base, *OTHER)
    # No reviewer page yet: the web has no connection to the standby.
    assert _web_connections(standby_db) == 0
    before = _exported(primary_db, demo)

    first = _export(reviewer)
    assert first and {r["tenant_id"] for r in first} == {demo}
    # The export's read opened the web's connection to the standby
    assert _web_connections(standby_db) >= 1
    # and its record was written (a standby refuses writes: on the primary).
    cluster.wait_for(  # written as the stream ends
        "the export's record",
        lambda: _exported(primary_db, demo) == before + 1,
        timeout=10,
    )
    # Once replayed there, the next export, read on the standby, has it.
    cluster.wait_for(
        "the record on the standby",
        lambda: _exported(standby_db, demo) == before + 1,
        timeout=30,
    )
    assert len(_export(reviewer)) == len(first) + 1
    # The history page says how far behind the replica is.
    _, text = cluster.wait_for(
        "the standby to catch up",
        lambda: (found := _lag(reviewer))[0] == "true" and found,
        timeout=30,
    )
    assert text.startswith("Read from the replica: caught up"), text
    # Another tenant's person: its own rows, none of the demo tenant's.
    others = _export(other)
    assert others and demo not in {r["tenant_id"] for r in others}
    reviewer.close()
    other.close()

    # Row-level security on the standby: the app role sees no row without a scope
    # (so the reviewer's rows above came through the portal's scope there).
    app = standby.conninfo(user=db_roles.APP_ROLE, dbname=DBNAME)
    with psycopg.connect(app, autocommit=True) as db:
        assert db.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        assert db.execute("SELECT count(*) FROM audit_event").fetchone() == (0,)
        with db.transaction():
            db.execute("SELECT set_config('portal.tenant_ids', %s, true)", [demo])
            scoped = db.execute(
                "SELECT count(*) FROM audit_event WHERE code = 'audit.exported'"
            ).fetchone()
            assert scoped is not None and scoped[0] >= before + 1
