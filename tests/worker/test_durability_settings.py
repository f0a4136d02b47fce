"""R11: the settings that promise durability, read off the live servers (issue 25).

Nothing here trusts a settings file: each value is asked of the process that acts
on it.

- PostgreSQL, on a live session of the app role (what ``ALTER ROLE`` / ``ALTER
  DATABASE`` / ``postgresql.conf`` add up to): ``fsync``, ``synchronous_commit`` and
  ``full_page_writes`` are ``on``. The one stated exception: the outbox relay's claim
  and ``sent`` marks set ``synchronous_commit = off`` for their own transactions
  (``set_config(..., true)``), which docs/outbox.md explains is safe (the outbox is
  at least once; the rows themselves were committed synchronously). The test finds
  every place the product's code could turn it off and fails on any other (besides
  the embedded server a test suite starts for itself, ``launcher/suite.py``).
- Celery, on a running worker (``inspect conf``): ``task_acks_late`` and
  ``task_reject_on_worker_lost`` are true, and every job of ours is acked late.
- The relay's publisher, built as the relay builds it (``broker_publisher``): after
  one wave, RabbitMQ itself lists the relay's channel in confirm mode
  (``rabbitmqctl list_channels``), and the publisher counted the broker's ack.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import uuid
from typing import Any

import psutil
import psycopg
import pytest
from django.db import connection

from audit.broker import broker_publisher
from audit.relay import ClaimedMessage
from config.celery import app
from launcher import embedded_db, suite
from portal.db_roles import APP_ROLE
from tests.support import net
from tests.support.broker import EventQueue
from tests.support.celery_worker import celery_worker_running

from .conftest import REPO, subprocess_env

pytestmark = pytest.mark.django_db

# The only code allowed to turn synchronous commits off, and how (docs/outbox.md).
RELAY_ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true)"
PRODUCT_DIRS = (
    "portal", "audit", "tasks", "console", "policies", "limits", "routing", "deploy",
    "launcher", "mcp_server", "tenant_deletion",
)  # fmt: skip
TURNS_OFF = re.compile(
    r"set_config\(\s*'synchronous_commit'|\bSET\s+(LOCAL\s+|SESSION\s+)?"
    r"synchronous_commit\b|synchronous_commit=",
    re.IGNORECASE,
)


DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


def _shown(cursor: Any) -> dict[str, str]:
    shown = {}
    for name in DURABLE:
        cursor.execute(f"SHOW {name}")
        (shown[name],) = cursor.fetchone()
    return shown


def test_postgresql_promises_durable_commits_to_the_app_role(tmp_path) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        assert cursor.fetchone() == (APP_ROLE,)
        live = _shown(cursor)
        # No ALTER ROLE / ALTER DATABASE turns one off, for any role or database.
        cursor.execute(
            "SELECT count(*) FROM pg_db_role_setting, unnest(setconfig) AS setting"
            " WHERE split_part(setting, '=', 1) = ANY(%s)",
            [list(DURABLE)],
        )
        assert cursor.fetchone() == (0,)
    if os.environ.get(suite.THROWAWAY_SERVER_ENV) != "1":
        assert live == DURABLE
        return
    # The suite runs on a server it started without fsync (no DATABASE_URL: a fresh
    # machine's `manage.py test`). The product's server there is the one
    # `manage.py up` starts: start it the same way and read it.
    assert live == dict.fromkeys(DURABLE, "off")
    server = embedded_db.EmbeddedServer(
        data_dir=tmp_path / "pgdata", port=net.free_port()
    )
    server.start()
    try:
        with psycopg.connect(server.url) as product:
            assert _shown(product.cursor()) == DURABLE
    finally:
        server.stop()


def test_only_the_relay_commits_asynchronously_and_only_its_own_transactions() -> None:
    """Every place the product could turn synchronous commits off: a
    ``set_config``, an SQL ``SET``, a ``-c synchronous_commit=`` option."""
    found: list[tuple[str, str]] = []
    for path in sorted(
        item
        for folder in PRODUCT_DIRS
        for item in (REPO / folder).rglob("*")
        if item.suffix in {".py", ".sql", ".conf", ".ini", ".service", ".example"}
    ):
        where = str(path.relative_to(REPO))
        lines = path.read_text(errors="replace").splitlines()
        found += [(where, line.strip()) for line in lines if TURNS_OFF.search(line)]
    # The relay's claim and its sent marks, each transaction-local (the third
    # argument): the session is back to synchronous commits after them. And the
    # embedded server a test suite starts for itself on throwaway data
    # (launcher/suite.py, durable=False; ``up`` starts it durable).
    assert [(where, RELAY_ASYNC_COMMIT in line) for where, line in found] == [
        ("audit/relay.py", True),
        ("audit/relay.py", True),
        ("launcher/embedded_db.py", False),
    ], found
    assert found[2][1].startswith("_NOT_DURABLE: Final = "), found
    not_durable = [
        str(path.relative_to(REPO))
        for folder in PRODUCT_DIRS
        for path in (REPO / folder).rglob("*.py")
        if re.search(r"(?<![`\w])durable=False", path.read_text())
    ]
    assert not_durable == ["launcher/suite.py"], not_durable


def _worker_name(output: str) -> str:
    match = re.search(r"(\S+@\S+) ready\.", output)
    assert match, output[-2000:]
    return match[1]


def test_a_running_worker_acks_late_and_rejects_on_worker_lost(
    amqp_url: str, celery_test_queue: str
) -> None:
    env = subprocess_env(
        amqp_url=amqp_url, exchange="unused", CELERY_BROKER_URL=amqp_url
    )
    with celery_worker_running(
        queue=celery_test_queue, env=env, name="durability", ready_s=60
    ) as worker:
        name = _worker_name(worker.output())
        inspect = app.control.inspect(destination=[name], timeout=10)
        conf: dict[str, Any] = (inspect.conf(with_defaults=True) or {}).get(name, {})
        registered = (inspect.registered("acks_late") or {}).get(name, [])
    assert conf, "the worker did not answer inspect conf"
    assert (conf.get("task_acks_late"), conf.get("task_reject_on_worker_lost")) == (
        True,
        True,
    ), {k: v for k, v in conf.items() if "ack" in k or "lost" in k}
    ours = [line for line in registered if line.split(".")[0] in PRODUCT_DIRS]
    assert ours, registered
    assert all("acks_late=True" in line for line in ours), ours


def _rabbitmqctl() -> str:
    found = shutil.which("rabbitmqctl")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("rabbitmqctl is not installed (RabbitMQ's command line)")
        pytest.skip("rabbitmqctl is not installed (RabbitMQ's command line)")
    return found


def _amqp_ports() -> set[int]:
    """This process's own TCP connections to the broker, by local port."""
    return {
        item.laddr.port
        for item in psutil.Process().net_connections(kind="tcp")
        if item.raddr and item.raddr.port == 5672
    }


def test_the_relay_publishes_with_confirms_as_rabbitmq_sees_it(
    amqp_url: str, event_queue: EventQueue
) -> None:
    command = _rabbitmqctl()
    assert amqp_url.endswith("@127.0.0.1:5672//") or ":5672" in amqp_url
    message = ClaimedMessage(
        id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        topic="durability.check",
        key=str(uuid.uuid4()),
        body="{}",
        task_id=None,
        trace_id="",
        attempts=1,
        created_at=dt.datetime.now(dt.UTC),
    )
    before = _amqp_ports()
    with broker_publisher() as publisher:
        assert publisher.publish_wave([message]) == [None]  # acked by the broker
        [port] = _amqp_ports() - before
        listed = subprocess.run(
            [command, "-q", "list_channels", "name", "confirm"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    assert publisher.acks == 1
    assert len(event_queue.drain(expected=1, timeout=30)) == 1
    ours = [line for line in listed.splitlines() if f":{port} -> " in line]
    assert ours, listed
    assert all(line.split("\t")[-1].strip() == "true" for line in ours), ours
