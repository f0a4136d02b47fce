"""A real witness for the tests: ``manage.py witness`` in its own process.

It listens on a free port of 127.0.0.1, keeps its state in a folder of its own
(never the database) and trusts the portal's published log key (the development
signer's ``var/audit-public-key.pem`` unless another is given).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunningWitness:
    name: str
    url: str
    vkey: str
    state_dir: Path
    key_file: Path
    process: subprocess.Popen[str]

    @property
    def entry(self) -> str:
        """What ``PORTAL_AUDIT_WITNESSES`` takes for it."""
        return f"{self.vkey} {self.url}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _start(
    *, name: str, state_dir: Path, key_file: Path, log_key: Path | None, port: int
) -> RunningWitness:
    args = [
        sys.executable, str(ROOT / "manage.py"), "witness",
        "--name", name, "--state-dir", str(state_dir), "--key-file", str(key_file),
        "--listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    if log_key is not None:
        args += ["--log-key", str(log_key)]
    process = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PORTAL_NO_BOOTSTRAP": "1"},
    )
    assert process.stdout is not None
    vkey = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the witness stopped: exit {process.wait()}")
        if line.startswith("key "):
            vkey = line.split(" ", 1)[1].strip()
            break
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/{'0' * 64}/checkpoint", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    return RunningWitness(
        name=name,
        url=url,
        vkey=vkey,
        state_dir=state_dir,
        key_file=key_file,
        process=process,
    )


@contextmanager
def running_witness(
    folder: Path, *, name: str = "witness.test/w1", log_key: Path | None = None
) -> Iterator[RunningWitness]:
    """A witness process with its key and state under ``folder``."""
    witness = _start(
        name=name,
        state_dir=folder / "state",
        key_file=folder / "witness-key.pem",
        log_key=log_key,
        port=free_port(),
    )
    try:
        yield witness
    finally:
        witness.stop()


def restart(witness: RunningWitness) -> RunningWitness:
    """The same witness (key, state) in a new process, as after a crash."""
    witness.stop()
    return _start(
        name=witness.name,
        state_dir=witness.state_dir,
        key_file=witness.key_file,
        log_key=None,
        port=int(witness.url.rsplit(":", 1)[1]),
    )
