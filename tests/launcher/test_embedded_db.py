"""The embedded PostgreSQL server starts, serves and never outlives its launcher.

These tests run real servers on free ports in a temporary data directory; they need
no Django database.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from launcher.embedded_db import embedded_postgres
from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data directory for the module: initdb runs once."""
    return tmp_path_factory.mktemp("var") / "pgdata"



def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split()[0])


def is_gone(pid: int) -> bool:
    """The process has exited (an unreaped zombie counts: it runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not is_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_server_serves_queries_and_stops_with_the_block(data_dir: Path) -> None:
    # given a free port and a data directory
    port = free_port()

    # when the context manager runs a server
    with embedded_postgres(port, data_dir=data_dir) as url:
        pid = postmaster_pid(data_dir)
        with psycopg.connect(url) as connection:
            (answer,) = connection.execute("SELECT 1").fetchone() or (None,)

    # then it answered on the yielded URL, and is gone once the block ended
    assert url == f"postgres://postgres@127.0.0.1:{port}/portal"
    assert answer == 1
    assert is_gone(pid)


def test_server_dies_with_a_sigkilled_launcher(data_dir: Path) -> None:
    # given a launcher process holding a running server
    port = free_port()
    launcher_code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from launcher.embedded_db import embedded_postgres

        with embedded_postgres({port}, data_dir=Path({str(data_dir)!r})) as url:
            print(url, flush=True)
            time.sleep(300)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", launcher_code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    ) as launcher:
        assert launcher.stdout is not None
        ready = launcher.stdout.readline()
        assert ready.startswith("postgres://"), "the launcher did not start a server"
        pid = postmaster_pid(data_dir)
        assert not is_gone(pid)

        # when the launcher is killed without a chance to clean up
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()

    # then the server shuts itself down instead of lingering as an orphan
    assert wait_until_gone(pid, timeout=10), f"postgres {pid} outlived its launcher"
