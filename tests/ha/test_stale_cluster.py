"""A cluster left behind by a killed run is stopped before the next one starts
(``ha.reap_stale_clusters``, called by ``ha.running_cluster``); a live run's is not.
So is an isolated node's network namespace and veth pair (``netns.reap_stale``,
called by ``netns.remote_link``, which ``ha.running_cluster(isolated=True)`` uses)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ha, netns


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


def _netns_pids(name: str) -> list[str]:
    done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return done.stdout.split()


def test_a_killed_runs_network_namespace_is_removed_and_a_live_runs_is_not() -> None:
    netns.require()
    # Given a namespace (with its veth pair and a process inside) of a test process
    # that has ended, as a killed run leaves its isolated node's
    ended = subprocess.Popen(["true"])
    ended.wait()
    stale = f"{netns.NETNS_PREFIX}{ended.pid}-a1b2c3"
    stale_veth = f"{netns.VETH_PREFIX}a1b2c3o"
    # And one of a test process that runs (this one)
    live = f"{netns.NETNS_PREFIX}{os.getpid()}-d4e5f6"
    made: list[str] = []
    inside: subprocess.Popen[bytes] | None = None
    try:
        for name, token in ((stale, "a1b2c3"), (live, "d4e5f6")):
            subprocess.run(["ip", "netns", "add", name], check=True)
            made.append(name)
            subprocess.run(
                ["ip", "link", "add", f"{netns.VETH_PREFIX}{token}o", "type", "veth",
                 "peer", "name", f"{netns.VETH_PREFIX}{token}i", "netns", name],
                check=True,
            )  # fmt: skip
        inside = subprocess.Popen(
            ["ip", "netns", "exec", stale, "sleep", "600"], start_new_session=True
        )
        deadline = time.monotonic() + 10
        while str(inside.pid) not in _netns_pids(stale):  # entered it
            assert time.monotonic() < deadline, "the process never entered it"
            time.sleep(0.05)

        # When the next run starts
        reaped = netns.reap_stale()

        # Then the stale namespace, its pair and what ran in it are gone
        assert stale in reaped
        assert inside.wait(timeout=10) is not None
        names = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout
        assert stale not in names
        # (the pair goes with the namespace, which the kernel frees in the background)
        deadline = time.monotonic() + 10
        while (
            subprocess.run(
                ["ip", "link", "show", stale_veth], capture_output=True
            ).returncode
            == 0
        ):
            assert time.monotonic() < deadline, f"{stale_veth} outlived its namespace"
            time.sleep(0.1)
        # And the live run's is untouched
        assert live not in reaped
        assert live in names
    finally:
        if inside is not None and inside.poll() is None:
            inside.kill()
            inside.wait()
        for name in made:
            subprocess.run(
                ["ip", "netns", "delete", name], capture_output=True, check=False
            )
        for token in ("a1b2c3", "d4e5f6"):
            subprocess.run(
                ["ip", "link", "delete", f"{netns.VETH_PREFIX}{token}o"],
                capture_output=True,
                check=False,
            )
