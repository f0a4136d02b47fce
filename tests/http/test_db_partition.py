"""A partition under an OPEN database connection, with real kernel faults (issue 25,
R15).

PostgreSQL runs on a machine of its own: a private cluster (``initdb``) started
inside a network namespace (tests/support/netns.py), listening on its end of a veth
pair, with a copy of the test database. A real gunicorn on this side serves it. An
agent's registration waits on the open connection (another session holds the
tasks table's lock) when every packet to and from the database's machine starts
being dropped: no FIN, no RST, the kind of silence the TCP fault proxy of
tests/http/test_db_link.py cannot make (it acknowledges the bytes).

With the connection's keepalives and ``tcp_user_timeout`` (config/settings.py,
``PORTAL_DB_TCP_USER_TIMEOUT_S``) the wait ends within that timeout + 1 s as a 503
problem+json with ``Retry-After``; the server's side of the connection gives up too,
so nothing of the request is kept and its locks go; once the link heals, the retry
registers the task once, in its tenant's scope. Without the options the request
hangs until gunicorn kills its worker (``PORTAL_DB_PARTITION_CONTROL=1`` runs that
case and expects the hang: docs/reliability.md has the figure).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
from django.db import connection

from portal import db_roles
from portal import services as portal_services
from portal.models import Agent, Tenant
from tests.support import netns

from .conftest import Server, start, stop

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

USER_TIMEOUT_S = 3  # the test's PORTAL_DB_TCP_USER_TIMEOUT_S: small, to keep it quick
PORT = 5432  # the namespace's own: no clash with this side's servers
CONTROL = os.environ.get("PORTAL_DB_PARTITION_CONTROL") == "1"
PG_BIN = Path(
    next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), "/usr/bin")
    if Path("/usr/lib/postgresql").exists()
    else "/usr/bin"
)


@dataclass
class Remote:
    """The database's machine: its link, its cluster's Unix socket (reachable from
    this side whatever the network does) and the portal's database there."""

    link: netns.Link
    socket_dir: str
    dbname: str

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=self.socket_dir,
            port=PORT,
            user="postgres",
            dbname=self.dbname,
            autocommit=True,
        )

    def url(self, user: str) -> str:
        return f"postgres://{user}@{self.link.inner}:{PORT}/{self.dbname}"


def _as_postgres(*argv: str) -> None:
    subprocess.run(
        ["runuser", "-u", "postgres", "--", *argv],
        check=True,
        capture_output=True,
        timeout=120,
    )


def _wait_ready(socket_dir: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"postgres exited {server.returncode}")
        ready = subprocess.run(
            [str(PG_BIN / "pg_isready"), "-q", "-h", socket_dir, "-p", str(PORT)],
            check=False,
        )
        if ready.returncode == 0:
            return
        time.sleep(0.2)
    raise TimeoutError("the private PostgreSQL did not start")


def _copy_test_database(remote: Remote) -> None:
    """The test database, roles, schema, grants, policies and rows, on the remote."""
    db_roles.ensure_roles(remote.url("postgres").rsplit("/", 1)[0] + "/postgres")
    with psycopg.connect(
        host=remote.socket_dir, port=PORT, user="postgres", autocommit=True
    ) as admin:
        admin.execute(f'CREATE DATABASE "{remote.dbname}" OWNER {db_roles.OWNER_ROLE}')
    settings = connection.settings_dict
    dump = subprocess.Popen(
        [
            str(PG_BIN / "pg_dump"), "-Fc",
            "-h", settings["HOST"] or "127.0.0.1",
            "-p", str(settings["PORT"] or 5432),
            "-U", "postgres", settings["NAME"],
        ],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    restore = subprocess.run(
        [
            str(PG_BIN / "pg_restore"), "--exit-on-error",
            "-h", remote.socket_dir, "-p", str(PORT),
            "-U", "postgres", "-d", remote.dbname,
        ],
        stdin=dump.stdout,
        capture_output=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert dump.stdout is not None
    dump.stdout.close()
    assert dump.wait(timeout=60) == 0
    assert restore.returncode == 0, restore.stderr.decode(errors="replace")[-3000:]


@pytest.fixture
def remote(agents: Agents) -> Iterator[Remote]:
    """A private PostgreSQL inside a namespace of its own, with the test schema."""
    netns.require()
    folder = tempfile.mkdtemp(prefix="portal-nf-pg-")
    shutil.chown(folder, "postgres", "postgres")
    data_dir = f"{folder}/data"
    server: subprocess.Popen[bytes] | None = None
    with netns.remote_link() as link:
        try:
            _as_postgres(
                str(PG_BIN / "initdb"), "-D", data_dir, "-U", "postgres",
                "--auth=trust", "--no-sync",
            )  # fmt: skip
            with open(f"{data_dir}/pg_hba.conf", "a") as hba:
                hba.write(f"host all all {link.network} trust\n")
            with open(f"{folder}/server.log", "wb") as log:
                server = subprocess.Popen(
                    link.command(
                        str(PG_BIN / "postgres"), "-D", data_dir,
                        "-p", str(PORT), "-k", folder,
                        "-c", f"listen_addresses={link.inner}",
                        "-c", "fsync=off", "-c", "synchronous_commit=off",
                        user="postgres",
                    ),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            _wait_ready(folder, server)
            remote = Remote(
                link=link, socket_dir=folder, dbname=connection.settings_dict["NAME"]
            )
            _copy_test_database(remote)
            yield remote
        finally:
            link.heal()
            if server is not None and server.poll() is None:
                server.send_signal(signal.SIGINT)  # a fast shutdown: no waiting
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
            shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Agents:
    secret: str
    other_secret: str  # another tenant's agent


@pytest.fixture
def agents(transactional_db: None) -> Agents:
    """Two tenants' agents, committed in the test database before it is copied."""
    secrets = []
    for name in ("part-a", "part-b"):
        tenant = Tenant.objects.create(slug=f"{name}-{uuid.uuid4().hex[:8]}", name=name)
        agent = Agent.objects.create(tenant=tenant, name=f"{name}-agent")
        secrets.append(portal_services.agent_key_issue(agent=agent).secret)
    return Agents(secret=secrets[0], other_secret=secrets[1])


@pytest.fixture
def portal(
    agents: Agents, remote: Remote, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A real gunicorn on this side whose database is across the link."""
    log_path: Path = tmp_path_factory.mktemp("gunicorn") / "server.log"
    tcp = (
        {  # the kernel's defaults: keepalive after 2 h, no user timeout
            "PORTAL_DB_TCP_USER_TIMEOUT_S": "0",
            "PORTAL_DB_KEEPALIVES_IDLE_S": "0",
            "PORTAL_DB_KEEPALIVES_INTERVAL_S": "0",
            "PORTAL_DB_KEEPALIVES_COUNT": "0",
        }
        if CONTROL
        else {
            "PORTAL_DB_TCP_USER_TIMEOUT_S": str(USER_TIMEOUT_S),
            "PORTAL_DB_KEEPALIVES_IDLE_S": "1",
            "PORTAL_DB_KEEPALIVES_INTERVAL_S": "1",
            "PORTAL_DB_KEEPALIVES_COUNT": str(USER_TIMEOUT_S),
        }
    )
    server = start(
        debug=False,
        log_path=log_path,
        workers=2,
        env_extra={"DATABASE_URL": remote.url(db_roles.APP_ROLE), **tcp},
    )
    try:
        yield server
    finally:
        stop(server)
    assert "Traceback" not in server.log(), server.log()[-5000:]


def _register(server: Server, secret: str, key: str, timeout: float) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/tasks",
        headers={"Authorization": f"Bearer {secret}"},
        json={
            "client_task_id": key,
            "workflow_key": "customer-issue",
            "workflow_version": "1",
            "object_type": "customer_issue",
            "object_id": key,
            "object_version": "1",
        },
        timeout=timeout,
    )


def _wait_for(check: object, timeout: float, what: str) -> float:
    began = time.monotonic()
    while not check():  # type: ignore[operator]
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - began


def _tasks(remote: Remote, key: str) -> int:
    with remote.admin() as admin:
        row = admin.execute(
            "SELECT count(*) FROM tasks_task WHERE client_task_id = %s", [key]
        ).fetchone()
    assert row is not None
    return int(row[0])  # type: ignore[call-overload]


def _portal_backends(remote: Remote, state: str | None = None) -> int:
    """The portal's sessions on the remote (over the link, not our Unix socket)."""
    with remote.admin() as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s"
            " AND client_addr IS NOT NULL AND (%s::text IS NULL OR"
            " wait_event_type = %s)",
            [db_roles.APP_ROLE, state, state],
        ).fetchone()
    assert row is not None
    return int(row[0])  # type: ignore[call-overload]


def test_a_partition_under_a_waiting_query_is_a_bounded_503_and_nothing_is_kept(
    portal: Server, remote: Remote, agents: Agents
) -> None:
    # Given: the link works, and a first registration warms the web worker's
    # connection (the partition must fall on an OPEN one).
    for _ in range(2):  # each of the two workers
        warm = _register(portal, agents.secret, f"warm-{uuid.uuid4().hex}", 30)
        assert warm.status_code == 201, warm.text
    key = f"cut-{uuid.uuid4().hex[:12]}"
    holder = remote.admin()
    holder.autocommit = False
    holder.execute("LOCK TABLE tasks_task IN ACCESS EXCLUSIVE MODE")
    answers: list[httpx.Response | BaseException] = []

    def call() -> None:
        try:
            answers.append(_register(portal, agents.secret, key, 60))
        except httpx.HTTPError as error:
            answers.append(error)

    caller = threading.Thread(target=call)
    try:
        caller.start()
        # When: the registration's query waits on the lock, the link is cut.
        _wait_for(lambda: _portal_backends(remote, "Lock") == 1, 30, "lock wait")
        remote.link.cut()
        cut_at = time.monotonic()
        caller.join(timeout=USER_TIMEOUT_S + 1 + (30 if CONTROL else 5))
        took = time.monotonic() - cut_at
        if CONTROL:
            # Without the options nothing ends the wait before gunicorn's worker
            # timeout (30 s): this is the failure the options prevent.
            pytest.fail(
                f"control: answered={not caller.is_alive()} {answers!r} after"
                f" {took:.1f} s (bound {USER_TIMEOUT_S + 1} s)"
            )
        # Then: the wait ended within the user timeout + 1 s, as a retryable 503.
        assert not caller.is_alive() and took <= USER_TIMEOUT_S + 1, took
        [answer] = answers
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["code"] == "DATABASE_UNAVAILABLE"
        assert int(answer.headers["retry-after"]) >= 1
        print(f"partition under a waiting query: 503 after {took:.2f} s")
    finally:
        holder.rollback()
        holder.close()
        caller.join(timeout=60)
        remote.link.heal()

    # The server's side gave up too (its own keepalives): the backend that was
    # waiting rolled back and is gone, so it holds no lock; nothing was kept.
    gone = _wait_for(
        lambda: _portal_backends(remote, "Lock") == 0 and _tasks(remote, key) == 0,
        USER_TIMEOUT_S + 5,
        "the cut session's end",
    )
    assert _tasks(remote, key) == 0
    print(f"the cut session gone {gone:.2f} s after the lock was released")

    # Healed: the retry registers it once, visible to its tenant only.
    again = _register(portal, agents.secret, key, 30)
    assert again.status_code == 201, again.text
    assert _register(portal, agents.secret, key, 30).status_code == 200
    assert _tasks(remote, key) == 1
    task_id = again.json()["id"]
    mine = httpx.get(
        f"{portal.base_url}/api/v1/tasks/{task_id}",
        headers={"Authorization": f"Bearer {agents.secret}"},
        timeout=30,
    )
    assert mine.status_code == 200 and mine.json()["client_task_id"] == key
    theirs = httpx.get(
        f"{portal.base_url}/api/v1/tasks/{task_id}",
        headers={"Authorization": f"Bearer {agents.other_secret}"},
        timeout=30,
    )
    assert theirs.status_code == 404, theirs.text
