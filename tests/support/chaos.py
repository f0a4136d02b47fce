"""Process and service faults for fault tests: real restarts, real kills."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import Literal

from django.db import connection

# The data directory of a PostgreSQL server this process may restart with ``pg_ctl``
# (a private one: ``initdb`` + ``pg_ctl start``, docs/chaos.md "Sizes and knobs").
# When set, it is the server restarted, whatever its port.
PGDATA_ENV = "PORTAL_FAULT_PGDATA"

Mode = Literal["fast", "immediate"]


def _pg_isready(host: str, port: str) -> bool:
    command = shutil.which("pg_isready")
    if command is None:
        return False
    return (
        subprocess.run([command, "-q", "-h", host, "-p", port], check=False).returncode
        == 0
    )


def _pg_ctl() -> str:
    found = shutil.which("pg_ctl") or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))),
        None,
    )
    if found is None:
        raise RuntimeError(f"{PGDATA_ENV} is set but no pg_ctl was found")
    return found


def _as_owner(data_dir: Path) -> list[str]:
    """``pg_ctl`` refuses root: run it as the data directory's owner then."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", pwd.getpwuid(data_dir.stat().st_uid).pw_name, "--"]


def restart_database(mode: Mode = "fast", timeout: float = 60) -> str:
    """Restart the PostgreSQL server the tests use, for real where we can.

    ``mode`` is ``pg_ctl``'s: ``fast`` ends every session and shuts down cleanly;
    ``immediate`` kills the server without a shutdown checkpoint, so the start
    that follows is a crash recovery that replays the WAL. The server restarted:
    the one whose data directory ``PORTAL_FAULT_PGDATA`` names (``pg_ctl``), else
    the machine's cluster (127.0.0.1:5432 with ``pg_ctlcluster``). Elsewhere (the
    embedded server, owned by the test command) a ``fast`` restart is every other
    session of the test database terminated, which is what a restart looks like
    from the application; an ``immediate`` one cannot be imitated and raises.
    Returns which was done.
    """
    settings = connection.settings_dict
    host, port = settings["HOST"] or "127.0.0.1", str(settings["PORT"] or 5432)
    versions = (
        sorted(Path("/etc/postgresql").glob("*"))
        if Path("/etc/postgresql").exists()
        else []
    )
    data_dir = os.environ.get(PGDATA_ENV, "").strip()
    if data_dir:
        command = [
            *_as_owner(Path(data_dir)),
            _pg_ctl(),
            "restart",
            "-D",
            data_dir,
            "-m",
            mode,
            "-w",
            "-l",
            str(Path(data_dir).parent / "server.log"),
        ]
        done = f"pg_ctl restart -m {mode} ({data_dir})"
    elif port == "5432" and shutil.which("pg_ctlcluster") and versions:
        command = [
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            versions[-1].name,
            "main",
            "restart",
            "-m",
            mode,
        ]
        done = f"restarted the cluster (-m {mode})"
    elif mode == "immediate":
        raise RuntimeError(
            f"a crash needs a server this process may restart: set {PGDATA_ENV}"
        )
    else:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        connection.close()
        return "terminated every other session"
    connection.close()
    subprocess.run(command, check=True, capture_output=True, timeout=timeout)
    deadline = time.monotonic() + timeout
    while not _pg_isready(host, port):
        if time.monotonic() > deadline:
            raise TimeoutError("PostgreSQL did not come back")
        time.sleep(0.2)
    return done
