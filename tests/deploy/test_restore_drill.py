"""The restore drill of docs/operations.md ("Backup and restore"), for real.

A portal database with the README demo's data and one operation left in flight (the
ticket desk made the ticket, then the process that called it was SIGKILLed before
recording it) is dumped with ``pg_dump --format=custom`` by a backup role
(``BYPASSRLS``, ``pg_read_all_data``), restored with ``pg_restore`` by portal_owner
into a new database it owns, and the portal pointed at it: ``migrate`` has
nothing to do, the API serves the same tasks, the settle job resumes the operation
through the recovery protocol without a second ticket, and ``verify_audit`` passes.

What the environment file holds goes along with the dump, as it would in
``/etc/portal/``: the server secret the connector keys are sealed under, and the
outbound allow-list naming the desk. Started without that allow-list, the restored
portal's receipt lookup is refused before anything is sent and the operation waits
``unknown``; with it back, the next settle run verifies the operation.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from portal import db_roles
from portal_client import FieldValue, PortalClient
from tasks import outbound
from tests.deploy import support
from tests.deploy.units import REPO
from tests.http.conftest import start, stop
from tests.support.db import client_tool
from ticketdesk.harness import TicketDesk, start_ticketdesk

AGENT_KEY = re.compile(r"issued a new API key for '[^']+': (\S+) \(shown once\)")
ISSUES = 3
IN_FLIGHT_KEY = "ticket-for-issue-9"
# This run's own role (docs/operations.md calls it portal_backup).
BACKUP_ROLE = f"portal_backup_ops_{secrets.token_hex(4)}"
SETTLE_TIMEOUT_S = 60.0


@pytest.fixture
def backup_role() -> Iterator[str]:
    """A backup role as docs/operations.md makes it: reads all, bypasses RLS."""
    admin = support.admin_params()
    with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
        conn.execute(
            sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(BACKUP_ROLE))
        )
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN BYPASSRLS IN ROLE pg_read_all_data").format(
                sql.Identifier(BACKUP_ROLE)
            )
        )
    yield BACKUP_ROLE
    with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
        conn.execute(
            sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(BACKUP_ROLE))
        )


def _env(tmp: Path, database: str, **extra: str) -> dict[str, str]:
    """Development settings on ``database`` as the app role; the same var/ folder
    (its audit signing key) before and after the restore."""
    env = {
        k: v
        for k, v in os.environ.items()
        if "proxy" not in k.lower()
        and k
        not in ("DJANGO_SECRET_KEY", "CELERY_BROKER_URL", "PORTAL_EVENTS_BROKER_URL")
    }
    env.update(
        DATABASE_URL=support.url(database, role=db_roles.APP_ROLE),
        PORTAL_DEV_MODE="1",
        PORTAL_VAR_DIR=str(tmp / "var"),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _rows(database: str, query: str, *params: Any, tenant: str = "") -> list[Any]:
    """Rows as the app role, in ``tenant``'s scope (row-level security)."""
    with psycopg.connect(support.url(database, role=db_roles.APP_ROLE)) as conn:
        conn.execute("SELECT set_config('portal.tenant_ids', %s, true)", [tenant])
        return conn.execute(query, params).fetchall()


def _tasks(client: PortalClient) -> list[tuple[str, str]]:
    return sorted((t.client_task_id, t.state) for t in client.list_tasks())


def _fields() -> list[FieldValue]:
    now = dt.datetime.now(dt.UTC)
    return [
        FieldValue(
            name="email", value="ana@example.com", source="crm", observed_at=now
        ),
        FieldValue(name="plan", value="pro", source="billing", observed_at=now),
    ]


def _leave_in_flight(
    client: PortalClient, env: dict[str, str], database: str
) -> tuple[str, str]:
    """Reserve issue-9's ticket and have a gateway process die right after the desk
    made it (tests/support/gateway_child.py): the operation stays ``executing``."""
    client.record_object_version("customer_issue", "9", version="7")
    task, _ = client.register_task(
        client_task_id="issue-9",
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id="9",
        object_version="7",
        contract_key="customer-issue",
    )
    leased = client.acquire_lease(task.id, owner="drill", ttl_s=600)
    assert leased.lease is not None
    token = leased.lease.token
    client.transition(
        task.id,
        to="running",
        expected_state_version=leased.state_version,
        lease_token=token,
        step="claimed",
    )
    operation, _ = client.reserve_operation(
        task.id,
        lease_token=token,
        idempotency_key=IN_FLIGHT_KEY,
        action="create_ticket",
        target="ticket-desk",
        input={"queue": "billing", "summary": "Refund for issue 9", "customer": "ana"},
    )
    # The tenant first (portal_tenant has no tenant scope), then its agent in it.
    [(tenant_id,)] = _rows(
        database, "SELECT id::text FROM portal_tenant WHERE slug = 'demo'"
    )
    [(agent_id,)] = _rows(
        database, "SELECT id::text FROM portal_agent WHERE tenant_id = %s",
        tenant_id, tenant=tenant_id,
    )  # fmt: skip
    fields = [field.as_json() for field in _fields()]
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.gateway_child",
            "--tenant",
            tenant_id,
            "--operation",
            operation.id,
            "--lease-token",
            str(token),
            "--agent",
            agent_id,
            "--fields",
            json.dumps(fields),
            "--crash-at",
            "after_call",
        ],
        env={**env, "PORTAL_NO_BOOTSTRAP": "1"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == -9, child.stdout + child.stderr  # SIGKILLed for real
    return tenant_id, operation.id


@pytest.mark.timeout(900)  # several servers and commands on a shared machine
def test_a_dump_restores_and_the_restored_portal_resumes_in_flight_work(
    make_database: Callable[[str], str],
    backup_role: str,
    tmp_path: Path,
) -> None:
    source = make_database("drill_src")
    restored = make_database("drill_dst")
    owner = {"DATABASE_OWNER_URL": support.url(source, role=db_roles.OWNER_ROLE)}
    desk: TicketDesk = start_ticketdesk()
    # The environment file's settings, the same before and after the restore
    # (docs/operations.md, "What to keep besides the dump"): the connectors' private
    # keys are sealed under the server secret; the outbound URL policy calls a
    # loopback desk over http only when named; a long deadline would keep the
    # in-flight call out of recovery's reach.
    kept = {
        "PORTAL_REDACTION_SECRET": secrets.token_urlsafe(32),
        "PORTAL_OUTBOUND_ALLOWED_HOSTS": outbound.host_port(desk.url),
        "PORTAL_EXECUTION_DEADLINE_S": "1",
    }
    env = _env(tmp_path, source, **kept)
    servers = []
    try:
        # Given: a migrated portal with the README demo's data and agent run.
        _ok(support.manage({**env, **owner}, "migrate", "--noinput"))
        seeded = _ok(
            support.manage(
                env,
                "seed_demo",
                "--ticketdesk-url",
                desk.url,
                "--ticketdesk-keys",
                str(desk.keys_path),
            )
        )
        match = AGENT_KEY.search(seeded)
        assert match, seeded
        key = match[1]
        server = start(debug=False, log_path=tmp_path / "source.log", env_extra=env)
        servers.append(server)
        agent = subprocess.run(
            [
                sys.executable,
                str(REPO / "examples" / "customer_issue_agent.py"),
                "--base-url",
                server.base_url,
                "--api-key",
                key,
                "--issues",
                str(ISSUES),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
            cwd=REPO,
            check=False,
        )
        assert agent.returncode == 0, agent.stdout + agent.stderr
        # And: one operation in flight: the desk made the ticket, nobody recorded it.
        with PortalClient(server.base_url, api_key=key) as client:
            tenant_id, operation_id = _leave_in_flight(client, env, source)
            before = _tasks(client)
        stop(servers.pop())
        assert [t["idempotency_key"] for t in desk.tickets()].count(IN_FLIGHT_KEY) == 1
        assert _rows(
            source,
            "SELECT state FROM tasks_operation WHERE id = %s",
            operation_id,
            tenant=tenant_id,
        ) == [("executing",)]
        _ok(support.manage(env, "checkpoint_audit"))

        # When: dumped by the backup role and restored into the new database.
        admin = support.admin_params()
        with psycopg.connect(**admin, dbname="postgres") as conn:
            server_version = conn.info.server_version
        # The tools of the server's version (a fresh machine's embedded server is
        # newer than Debian's client programs, which refuse it).
        pg_dump = client_tool("pg_dump", server_version_num=server_version)
        pg_restore = client_tool("pg_restore", server_version_num=server_version)
        dump = tmp_path / "portal.dump"
        connection = ["--host", admin["host"], "--port", str(admin["port"])]
        subprocess.run(
            [
                pg_dump,
                *connection,
                "--username",
                backup_role,
                "--format=custom",
                "--file",
                str(dump),
                source,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        # The discovery functions go back to their role, which may own them only
        # while it may create in the schema (docs/operations.md, "Restore").
        schema_create = "{} CREATE ON SCHEMA public {} " + db_roles.DISCOVERY_ROLE
        with psycopg.connect(
            support.url(restored, role=db_roles.OWNER_ROLE), autocommit=True
        ) as conn:
            conn.execute(schema_create.format("GRANT", "TO"))
        restore = subprocess.run(
            [
                pg_restore,
                *connection,
                "--username",
                db_roles.OWNER_ROLE,
                "--dbname",
                restored,
                "--exit-on-error",
                str(dump),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert restore.returncode == 0, restore.stderr
        with psycopg.connect(
            support.url(restored, role=db_roles.OWNER_ROLE), autocommit=True
        ) as conn:
            conn.execute(schema_create.format("REVOKE", "FROM"))
        env = _env(tmp_path, restored, **kept)
        owner = {"DATABASE_OWNER_URL": support.url(restored, role=db_roles.OWNER_ROLE)}

        # Then: the owner still owns everything, and migrate has nothing to do.
        assert _rows(
            restored,
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'",
        ) == [(db_roles.OWNER_ROLE,)]
        migrated = _ok(support.manage({**env, **owner}, "migrate", "--noinput"))
        assert "No migrations to apply." in migrated, migrated
        # And: the restored portal serves the same tasks.
        server = start(debug=False, log_path=tmp_path / "restored.log", env_extra=env)
        servers.append(server)
        with PortalClient(server.base_url, api_key=key) as client:
            assert _tasks(client) == before
            assert ("issue-9", "running") in before

        def settle_once(environment: dict[str, str]) -> tuple[str, int, str]:
            """Run the settle job (what beat schedules) once: the operation's state
            and attempts, and what the job wrote."""
            job = (
                "import django; django.setup(); "
                "from tasks.jobs import check_receipts_job; print(check_receipts_job())"
            )
            done = subprocess.run(
                [sys.executable, "-c", job],
                env={**environment, "PORTAL_NO_BOOTSTRAP": "1"},
                cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            output = _ok(done) + done.stderr
            [(state, attempts)] = _rows(
                restored,
                "SELECT state, attempts FROM tasks_operation WHERE id = %s",
                operation_id,
                tenant=tenant_id,
            )
            return state, attempts, output

        def settle(environment: dict[str, str], *, until_not: str) -> tuple[str, int]:
            """Run the settle job until the operation leaves ``until_not`` or the
            time is up; its state and attempts."""
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while True:
                state, attempts, _ = settle_once(environment)
                if state != until_not or time.monotonic() > deadline:
                    return state, attempts
                time.sleep(1)

        def recovery_events() -> list[tuple[str, str]]:
            return [
                (code, error or "")
                for code, error in _rows(
                    restored,
                    "SELECT code, payload->>'error' FROM audit_event"
                    " WHERE operation_id = %s ORDER BY id",
                    operation_id,
                    tenant=tenant_id,
                )
                if code
                in (
                    "connector.called",
                    "operation.unknown",
                    "receipt.queried",
                    "operation.verified",
                )
            ]

        def tickets_for_the_key() -> int:
            return [t["idempotency_key"] for t in desk.tickets()].count(IN_FLIGHT_KEY)

        # And: run with another server secret, the settle job cannot open the
        # connector's sealed signing key for the lookup's credential: it says so
        # once (CONNECTOR_KEY_UNSEALABLE, no traceback), the look is a "cannot
        # tell" on the operation, and nothing reaches the desk.
        stranger = _env(
            tmp_path,
            restored,
            **{**kept, "PORTAL_REDACTION_SECRET": secrets.token_urlsafe(32)},
        )
        state, attempts, output = settle_once(stranger)
        assert (state, attempts) == ("unknown", 1)
        assert "CONNECTOR_KEY_UNSEALABLE" in output, output
        assert "Traceback" not in output, output
        [*_, (code, error)] = recovery_events()
        assert code == "receipt.queried"
        assert error.startswith("CONNECTOR_KEY_UNSEALABLE"), error
        assert tickets_for_the_key() == 1
        # And: run without the environment file's allow-list, the settle job's
        # lookup (once its back-off is over) is refused before anything is sent
        # (a "cannot tell"): the operation waits 'unknown', and the desk made
        # nothing.
        forgetful = _env(
            tmp_path, restored, **{**kept, "PORTAL_OUTBOUND_ALLOWED_HOSTS": ""}
        )
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            state, attempts, _ = settle_once(forgetful)
            [*_, (code, error)] = recovery_events()
            if error.startswith("TARGET_FORBIDDEN") or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert (state, attempts) == ("unknown", 1)
        assert code == "receipt.queried"
        assert error.startswith("TARGET_FORBIDDEN"), error
        assert tickets_for_the_key() == 1
        # And: with the allow-list back, the settle job resumes the operation by its
        # key once its back-off is over, and verifies it on the first attempt.
        assert settle(env, until_not="unknown") == ("verified", 1)
        # Without a duplicate remote effect: still one ticket for the key.
        assert tickets_for_the_key() == 1
        # The crashed call was never recorded; recovery only looked the receipt up,
        # first without a credential (the other secret), then refused by the
        # policy, then answered.
        assert [code for code, _ in recovery_events()] == [
            "operation.unknown", "receipt.queried", "receipt.queried",
            "receipt.queried", "operation.verified",
        ]  # fmt: skip
        # And: the restored audit trail verifies, old checkpoints and new.
        _ok(support.manage(env, "checkpoint_audit"))
        verified = _ok(support.manage(env, "verify_audit"))
        assert "ok tenant demo:" in verified, verified
    finally:
        for server in servers:
            stop(server)
        desk.stop()
