"""``manage.py test [pytest args]``: the suite under pytest (see ``launcher.suite``).

Replaces Django's own ``test`` command; every argument goes to pytest untouched.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from launcher import embedded_db
from launcher.suite import run_pytest


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
