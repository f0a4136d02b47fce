"""``manage.py test [pytest args]``: the whole suite under pytest, database included.

Replaces Django's own ``test`` command. With DATABASE_URL unset, an embedded
PostgreSQL runs for the duration of the run (data in ``var/pgdata-test``, port
PORTAL_EMBEDDED_PG_PORT + 1, so it never meets the server of ``manage.py up``);
otherwise the tests use DATABASE_URL. The exit code is pytest's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal import embedded_db


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


class Command(BaseCommand):
    help = "Run the test suite with pytest; every argument is passed to pytest."
    # pytest-django sets Django up in the pytest process; checks run there.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "pytest_args", nargs=argparse.REMAINDER, help="arguments for pytest"
        )

    def run_from_argv(self, argv: list[str]) -> None:
        # Django's parser would claim options pytest also has (-v, --traceback,
        # --help…): everything after "test" goes to pytest untouched.
        self._called_from_command_line = True
        try:
            code = run_pytest(argv[2:])
        except embedded_db.LaunchError as error:
            self.stderr.write(f"test: {error}")
            code = 1
        sys.exit(code)

    def handle(self, *args: Any, **options: Any) -> None:
        code = run_pytest(list(options["pytest_args"]))
        if code:
            raise CommandError(f"pytest exited with code {code}", returncode=code)
