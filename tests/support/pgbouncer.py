"""A PgBouncer of the test's own (Debian's package), in transaction pooling mode.

Not the system service: a ``pgbouncer`` process with a generated ini in a temporary
folder, listening on a free 127.0.0.1 port, in front of the test run's PostgreSQL.
Authentication is ``trust`` with an auth_file naming the roles (PgBouncer's ``trust``
still wants the user listed); PostgreSQL here trusts 127.0.0.1 as well.

The settings mirror docs/operations.md ("PgBouncer"): ``options`` is ignored as a
startup parameter (PgBouncer 1.18 refuses it otherwise), and the timeouts the portal
would send in it are set on each server connection by ``connect_query`` instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.support.net import free_port

START_TIMEOUT_S = 30.0


def version() -> tuple[int, int] | None:
    """PgBouncer's version (major, minor), or None when it is not installed."""
    binary = shutil.which("pgbouncer")
    if binary is None:
        return None
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    assert match, out
    return int(match[1]), int(match[2])


def keeps_prepared_statements() -> bool:
    """PgBouncer 1.21 and later track protocol-level prepared statements in
    transaction pooling (``max_prepared_statements``); older ones do not."""
    found = version()
    return found is not None and found >= (1, 21)


def startup_timeouts(options: str) -> str:
    """The ``SET`` statements for the ``-c name=value`` pairs of a libpq ``options``
    string (the portal's lock and statement timeouts), for ``connect_query``."""
    pairs = re.findall(r"-c\s*(\w+)=(\S+)", options)
    assert pairs, options
    return "; ".join(f"SET {name} = {value}" for name, value in pairs)



@dataclass
class PgBouncer:
    port: int
    folder: Path
    process: subprocess.Popen[bytes]
    admin_user: str

    def log(self) -> str:
        return (self.folder / "pgbouncer.log").read_text(errors="replace")

    def conninfo(self, *, user: str, dbname: str) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": self.port, "user": user, "dbname": dbname}

    def url(self, *, user: str, dbname: str) -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{dbname}"

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW what`` on PgBouncer's admin console (SERVERS, POOLS, CLIENTS…)."""
        with psycopg.connect(
            **self.conninfo(user=self.admin_user, dbname="pgbouncer"),
            autocommit=True,
            prepare_threshold=None,
        ) as admin:
            # The console speaks the simple query protocol only.
            cursor = psycopg.ClientCursor(admin)
            cursor.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _ini(
    *,
    port: int,
    folder: Path,
    upstream: tuple[str, int],
    databases: Sequence[str],
    admin_user: str,
    pool_size: int,
    connect_query: str,
    ignore_startup_parameters: Sequence[str],
    max_prepared_statements: int,
) -> str:
    host, upstream_port = upstream
    quoted = connect_query.replace("'", "''")
    lines = ["[databases]"]
    for name in databases:
        entry = f"{name} = host={host} port={upstream_port} dbname={name}"
        if connect_query:
            entry += f" connect_query='{quoted}'"
        lines.append(entry)
    lines += [
        "",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {folder / 'userlist.txt'}",
        f"admin_users = {admin_user}",
        "pool_mode = transaction",
        f"default_pool_size = {pool_size}",
        "min_pool_size = 0",
        "reserve_pool_size = 0",
        "max_client_conn = 500",
        f"ignore_startup_parameters = {','.join(ignore_startup_parameters)}",
        f"logfile = {folder / 'pgbouncer.log'}",
        "log_connections = 0",
        "log_disconnections = 0",
    ]
    if max_prepared_statements:
        lines.append(f"max_prepared_statements = {max_prepared_statements}")
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root; it drops to this user itself.
        lines.append("user = postgres")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running_pgbouncer(
    *,
    upstream: tuple[str, int],
    databases: Sequence[str],
    users: Sequence[str],
    pool_size: int = 2,
    connect_query: str = "",
    ignore_startup_parameters: Sequence[str] = ("extra_float_digits", "options"),
    max_prepared_statements: int | None = None,
) -> Iterator[PgBouncer]:
    """A PgBouncer for ``databases`` on ``upstream``; stopped (and its folder
    removed) afterwards. ``max_prepared_statements`` defaults to 200 where the
    installed version knows the setting (1.21+)."""
    binary = shutil.which("pgbouncer")
    if binary is None:
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    if max_prepared_statements is None:
        max_prepared_statements = 200 if keeps_prepared_statements() else 0
    folder = Path(tempfile.mkdtemp(prefix="portal-pgbouncer-"))
    folder.chmod(0o777)  # written by the user PgBouncer drops to
    admin_user = users[0]
    port = free_port()
    (folder / "userlist.txt").write_text(
        "".join(f'"{user}" ""\n' for user in users)
    )
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        _ini(
            port=port,
            folder=folder,
            upstream=upstream,
            databases=databases,
            admin_user=admin_user,
            pool_size=pool_size,
            connect_query=connect_query,
            ignore_startup_parameters=ignore_startup_parameters,
            max_prepared_statements=max_prepared_statements,
        )
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    process = subprocess.Popen(
        [binary, str(ini)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    bouncer = PgBouncer(
        port=port, folder=folder, process=process, admin_user=admin_user
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                log = bouncer.log() if (folder / "pgbouncer.log").exists() else ""
                raise RuntimeError(f"pgbouncer exited {process.returncode}:\n{log}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("pgbouncer did not listen") from None
                time.sleep(0.1)
        yield bouncer
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # PgBouncer's "shut down now"
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)
