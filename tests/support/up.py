"""``manage.py up`` as a child of a test, the way the README runs it.

The tests that start the real ``up`` (``tests/e2e/test_demo.py``,
``tests/e2e/test_up_quiet.py``, ``tests/mcp/test_up.py``) share this: a scratch
database on the test server (so the embedded PostgreSQL is skipped), free ports,
their own var/ and static folders, a thread collecting what ``up`` prints, and a
kill if the test leaves it running.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import dj_database_url
import httpx
import psutil
import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from launcher import embedded_db

REPO = Path(__file__).resolve().parents[2]
# Migrating a fresh database takes most of it; a busy 2-core machine needs minutes.
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
AGENT_KEY = re.compile(r"Agent key:\s+Authorization: Bearer (\S+)")
DESK_URL = re.compile(r"Ticket desk:\s+(http://\S+)")


def server_params() -> dict[str, Any]:
    """How to reach the test run's PostgreSQL server (system or embedded)."""
    # The administrator's URL: ``up`` makes its two roles from it, as in the README.
    db = dj_database_url.parse(settings.DATABASE_URL)
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": int(db["PORT"] or 5432),
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
    }


@pytest.fixture
def scratch_database_url() -> Iterator[str]:
    """A new empty database on the test server, dropped afterwards."""
    params = server_params()
    name = f"portal_e2e_{secrets.token_hex(4)}"
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    auth = params["user"] + (f":{params['password']}" if params["password"] else "")
    try:
        yield f"postgres://{auth}@{params['host']}:{params['port']}/{name}"
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            # FORCE: a worker killed mid-query may leave a session behind.
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)
                )
            )


@dataclass
class Up:
    """A running ``manage.py up`` and everything it printed so far."""

    process: subprocess.Popen[bytes]
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    def output(self) -> str:
        return "\n".join(self.lines)

    def search(self, pattern: re.Pattern[str]) -> str | None:
        match = pattern.search(self.output())
        return match[1] if match else None


def _collect(stream: IO[bytes], lines: list[str]) -> None:
    with stream:
        lines.extend(raw.decode("utf-8", "replace").rstrip("\n") for raw in stream)


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without what would change what ``up`` does."""
    env = {
        key: value
        for key, value in os.environ.items()
        # A proxy must not stand between the agent and 127.0.0.1; a secret key
        # would turn on production settings, which seed nothing.
        if "proxy" not in key.lower()
        and key
        not in (
            "CELERY_BROKER_URL",
            "PORTAL_EVENTS_BROKER_URL",
            "DJANGO_SECRET_KEY",
            "PORTAL_PORT",
        )
    }
    env.update(overrides)
    return env


def alive(process: psutil.Process) -> bool:
    # A zombie has ended; only its parent (init, after up) has yet to reap it.
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_ready(up: Up, portal: str) -> tuple[str, str]:
    """Wait for /admin/login/ to answer 200 and the banner; its agent key and desk."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(trust_env=False, timeout=2) as http:
        while time.monotonic() < deadline:
            if up.process.poll() is not None:
                pytest.fail(f"up exited with {up.process.returncode}:\n{up.output()}")
            try:
                ready = http.get(f"{portal}/admin/login/").status_code == 200
            except httpx.TransportError:
                ready = False
            key, desk = up.search(AGENT_KEY), up.search(DESK_URL)
            if ready and key and desk:
                return key, desk
            time.sleep(0.5)
    pytest.fail(f"up was not ready in {READY_TIMEOUT_S:.0f} s:\n{up.output()}")


@contextmanager
def running_up(
    database_url: str,
    tmp_path: Path,
    *,
    port: int,
    args: Sequence[str] = (),
    stdin: int = subprocess.DEVNULL,
    unset: Sequence[str] = (),
    **env: str,
) -> Iterator[Up]:
    """``manage.py up --port PORT *args`` on ``database_url``, var/ and static files
    under ``tmp_path``; ``env`` adds to its environment, ``unset`` takes names out.
    Killed on the way out if still running (its children follow by their
    parent-death signal)."""
    child_env = clean_env(
        DATABASE_URL=database_url,
        PORTAL_VAR_DIR=str(tmp_path / "var"),
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        PYTHONUNBUFFERED="1",
        **env,
    )
    for name in unset:
        child_env.pop(name, None)
    process = subprocess.Popen(
        # The venv's interpreter: `python3 manage.py` would only re-exec into it.
        [sys.executable, "manage.py", "up", "--port", str(port), *args],
        cwd=REPO,
        env=child_env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # If this test process dies, up (and through it everything) goes too.
        preexec_fn=embedded_db.die_with_parent(signal.SIGTERM),
    )
    up = Up(process=process, env=child_env)
    assert process.stdout is not None
    up.pump = threading.Thread(
        target=_collect, args=(process.stdout, up.lines), daemon=True
    )
    up.pump.start()
    try:
        yield up
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdin is not None:
            process.stdin.close()
