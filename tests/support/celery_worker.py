"""A real Celery worker (and beat) as a child process, for tests that need one.

Started with ``python -m celery -A config worker`` in the repository, its output
read line by line on a thread (``lines``), and handed over only once it printed
``ready.``; stopped with SIGTERM (then SIGKILL after 30 s) when the block ends.
``celery_beat_running`` does the same for ``celery -A config beat`` (handed over
once it printed ``beat: Starting...``).
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
    with _running(worker, ready_mark=" ready.", ready_s=ready_s):
        yield worker


@contextmanager
def celery_beat_running(
    *, queue: str, env: dict[str, str], schedule: Path, ready_s: float = 90
) -> Iterator[RunningWorker]:
    """Celery beat with ``env`` (its jobs go to ``queue``, the environment's
    ``PORTAL_CELERY_QUEUE``), its state in the file ``schedule``, until the block
    ends; fails the test when it has not started within ``ready_s``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO",
         "--schedule", str(schedule)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    beat = RunningWorker(queue=queue, process=process)
    with _running(beat, ready_mark="beat: Starting...", ready_s=ready_s):
        yield beat


@contextmanager
def _running(
    child: RunningWorker, *, ready_mark: str, ready_s: float
) -> Iterator[None]:
    """Read ``child``'s output on a thread; yield once a line holds ``ready_mark``;
    SIGTERM it (SIGKILL after 30 s) when the block ends."""
    process = child.process
    ready = threading.Event()

    def read_output() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            child.lines.append(line)
            if ready_mark in line:
                ready.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        assert ready.wait(ready_s), child.output()[-3000:]
        yield
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
