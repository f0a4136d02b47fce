"""A cluster left behind by a killed run is stopped before the next one starts
(``ha.reap_stale_clusters``, called by ``ha.running_cluster``); a live run's is not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ha


def _cluster_folder(owner: int) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=ha.FOLDER_PREFIX))
    (folder / ha.OWNER_FILE).write_text(str(owner))
    return folder


def _server_in(folder: Path) -> subprocess.Popen[bytes]:
    """A process naming the folder on its command line, as Patroni names its
    configuration, in a session of its own (as ha._spawn starts them)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", str(folder / "node1" / "patroni.yml")],
        start_new_session=True,
    )  # fmt: skip


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_a_killed_runs_cluster_is_stopped_and_a_live_runs_is_not(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    # Given a cluster folder whose test process has ended, with a server still up
    ended = subprocess.Popen(["true"])
    ended.wait()
    stale = _cluster_folder(ended.pid)
    processes.append(stale_server := _server_in(stale))
    # And one of a test process that runs (this one)
    live = _cluster_folder(os.getpid())
    processes.append(live_server := _server_in(live))
    try:
        # When the next run starts
        reaped = ha.reap_stale_clusters()

        # Then the stale cluster's server is stopped and its folder gone
        assert stale in reaped
        assert stale_server.wait(timeout=10) is not None
        assert not stale.exists()
        # And the live run's cluster is untouched
        assert live not in reaped
        assert live_server.poll() is None
        assert live.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)
