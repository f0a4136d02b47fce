"""A real Celery worker as a child process, for tests that need one.

Started with ``python -m celery -A config worker`` in the repository, its output
read line by line on a thread (``lines``), and handed over only once it printed
``ready.``; stopped with SIGTERM (then SIGKILL after 30 s) when the block ends.
The chaos tier's pool of many workers is ``tests/fault/harness.WorkerPool``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class RunningWorker:
    queue: str
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "".join(self.lines)


@contextmanager
def celery_worker_running(
    *,
    queue: str,
    env: dict[str, str],
    pool: Sequence[str] = ("--pool", "solo"),
    name: str = "testworker",
    ready_s: float = 90,
) -> Iterator[RunningWorker]:
    """A worker consuming ``queue`` with ``env`` (the whole environment) until the
    block ends; fails the test when it is not ready within ``ready_s``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", *pool,
         "-Q", queue, "--loglevel", "INFO", "--without-mingle", "--without-gossip",
         "--hostname", f"{name}-{uuid.uuid4().hex[:6]}@%h"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    worker = RunningWorker(queue=queue, process=process)
    ready = threading.Event()

    def read_output() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            worker.lines.append(line)
            if " ready." in line:
                ready.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        assert ready.wait(ready_s), worker.output()[-3000:]
        yield worker
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(5)
        assert process.stdout is not None
        process.stdout.close()
