"""``manage.py test [pytest args]``: the whole suite under pytest, database included.

The work of the ``test`` command, which replaces Django's own. With DATABASE_URL
unset, an embedded PostgreSQL runs for the duration of the run (data in
``var/pgdata-test``, port PORTAL_EMBEDDED_PG_PORT + 1, so it never meets the server
of ``manage.py up``); otherwise the tests use DATABASE_URL. The exit code is
pytest's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from django.conf import settings

from . import embedded_db


def run_pytest(args: Sequence[str]) -> int:
    """Run pytest with ``args`` in a child process; return its exit code."""
    env = dict(os.environ)
    with ExitStack() as stack:
        if not env.get("DATABASE_URL"):
            port = embedded_db.settings_port() + 1
            data_dir = Path(settings.VAR_DIR) / "pgdata-test"
            print(
                f"test: starting embedded PostgreSQL on {embedded_db.HOST}:{port} "
                f"(data in {data_dir})…",
                file=sys.stderr,
                flush=True,
            )
            env["DATABASE_URL"] = stack.enter_context(
                # Throwaway data: crash safety is not worth the fsync time.
                embedded_db.embedded_postgres(port, data_dir=data_dir, durable=False)
            )
        return _run_in_foreground([sys.executable, "-m", "pytest", *args], env=env)


def _run_in_foreground(command: list[str], *, env: dict[str, str]) -> int:
    child = subprocess.Popen(  # noqa: S603 (our interpreter, the user's pytest args)
        command,
        cwd=settings.BASE_DIR,
        env=env,
        preexec_fn=embedded_db.die_with_parent(signal.SIGTERM),
    )

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    def let_child_handle(signum: int, frame: FrameType | None) -> None:
        # pytest shares the terminal's process group, so Ctrl-C reached it too; it
        # reports and cleans up, then this process stops the database.
        pass

    previous_int = signal.signal(signal.SIGINT, let_child_handle)
    previous_term = signal.signal(signal.SIGTERM, forward)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    # A child killed by a signal reports -signum; shells say 128 + signum.
    return code if code >= 0 else 128 - code
