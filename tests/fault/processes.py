"""A gateway execution in a process of its own, for the pause and clock-skew tests.

``tests/support/gateway_child.py`` is the process: it renews the task's lease for a
few seconds (a worker's heartbeat), then runs ``operation_execute`` under that lease
and stops itself (SIGSTOP) or dies (SIGKILL) at a named point of the gateway. This
module starts it, optionally under ``faketime`` (its clock skewed, the database's
not), and reads what it printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from portal.db import db_now

from .conftest import EXECUTION_DEADLINE_S, Planned, World
from .harness import REPO, database_url


def faketime() -> str:
    """Debian's libfaketime (package ``faketime``); a CI without it fails.

    Preloaded straight into the child (``LD_PRELOAD``): the ``faketime`` command
    forks and reports its child's signals as its own exit 1, which would hide the
    SIGKILL a test checks for.
    """
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found or shutil.which("faketime") is None:
        if os.environ.get("CI"):
            pytest.fail("faketime is not installed (apt-get install faketime)")
        pytest.skip("faketime is not installed (apt-get install faketime)")
    return str(found[0])


@dataclass
class Child:
    process: subprocess.Popen[str]

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_stopped(self, timeout: float = 60) -> None:
        """Until the kernel reports the process stopped (it sent itself SIGSTOP)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"exited before the stop:\n{self.finish()}")
            if psutil.Process(self.pid).status() == psutil.STATUS_STOPPED:
                return
            time.sleep(0.05)
        raise AssertionError("the child never stopped")

    def finish(self, timeout: float = 120) -> str:
        """Its whole output once it exits (stdout and stderr)."""
        out, _ = self.process.communicate(timeout=timeout)
        return out

    def lines(self, output: str) -> list[dict[str, Any]]:
        """The JSON lines it printed (its clock first, its outcome last)."""
        return [
            json.loads(line) for line in output.splitlines() if line.startswith("{")
        ]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def start_child(
    world: World,
    planned: Planned,
    *,
    lease_ttl_s: float,
    stop_at: str = "",
    crash_at: str = "",
    skew: str = "",
) -> Child:
    """Start ``gateway_child`` for ``planned`` under the agent's lease token.

    ``skew``: a libfaketime offset such as ``+10m``; the process's wall clock moves
    by it (its monotonic clock does not: timeouts stay real).
    """
    fields = [
        {
            "name": item.name,
            "value": item.value,
            "source": item.source,
            "observed_at": item.observed_at.isoformat(),
        }
        for item in world.fields(db_now())
    ]
    command = [
        sys.executable, "-m", "tests.support.gateway_child",
        "--tenant", str(world.tenant.pk),
        "--operation", str(planned.operation_id),
        "--lease-token", str(planned.lease_token),
        "--agent", str(world.agent.pk),
        "--fields", json.dumps(fields),
        "--lease-ttl", str(lease_ttl_s),
        "--stop-at", stop_at,
        "--crash-at", crash_at,
    ]  # fmt: skip
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="config.settings",
        PORTAL_EXECUTION_DEADLINE_S=str(EXECUTION_DEADLINE_S),
        PORTAL_NO_BOOTSTRAP="1",
        PYTHONUNBUFFERED="1",
    )
    if skew:
        env.update(
            LD_PRELOAD=faketime(), FAKETIME=skew, FAKETIME_DONT_FAKE_MONOTONIC="1"
        )
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Child(process=process)


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
