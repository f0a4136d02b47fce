"""Process and service faults for fault tests: real restarts, real kills."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from django.db import connection


def _pg_isready(host: str, port: str) -> bool:
    command = shutil.which("pg_isready")
    if command is None:
        return False
    return (
        subprocess.run([command, "-q", "-h", host, "-p", port], check=False).returncode
        == 0
    )


def restart_database(timeout: float = 60) -> str:
    """Restart the PostgreSQL server the tests use, for real where we can.

    The machine's cluster (127.0.0.1:5432 with ``pg_ctlcluster``) is restarted with a
    fast shutdown, which ends every session. Elsewhere (the embedded server, owned by
    the test command) every other session of the test database is terminated, which
    is what a restart looks like from the application. Returns which was done.
    """
    settings = connection.settings_dict
    host, port = settings["HOST"] or "127.0.0.1", str(settings["PORT"] or 5432)
    versions = (
        sorted(Path("/etc/postgresql").glob("*"))
        if Path("/etc/postgresql").exists()
        else []
    )
    if port == "5432" and shutil.which("pg_ctlcluster") and versions:
        connection.close()
        subprocess.run(
            [
                "pg_ctlcluster",
                "--skip-systemctl-redirect",
                versions[-1].name,
                "main",
                "restart",
                "-m",
                "fast",
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        while not _pg_isready(host, port):
            if time.monotonic() > deadline:
                raise TimeoutError("PostgreSQL did not come back")
            time.sleep(0.2)
        return "restarted the cluster"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    connection.close()
    return "terminated every other session"
