"""``manage.py up``: the whole portal on one machine (see ``launcher.up``)."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from launcher import embedded_db
from launcher.up import Up

from .seed_demo import ticketdesk_port


class Command(BaseCommand):
    help = (
        "Start the whole portal: database, demo ticket desk, migrations, demo data, "
        "web server, Celery worker and beat. Ctrl-C stops everything."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("PORTAL_PORT", "8000")),
            help="web server port on 127.0.0.1 (default: PORTAL_PORT or 8000)",
        )
        parser.add_argument(
            "--ticketdesk-port",
            type=int,
            default=ticketdesk_port(),
            help="the demo ticket desk's port on 127.0.0.1 "
            "(default: PORTAL_TICKETDESK_PORT or 8100)",
        )
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="run the web server (and the ticket desk) only, without Celery "
            "worker and beat",
        )

    def handle(
        self,
        *args: Any,
        port: int,
        ticketdesk_port: int,
        no_worker: bool,
        **options: Any,
    ) -> None:
        # Enter prints the banner again; a closed stdin (a service, a test) is
        # simply at its end.
        up = Up(stdout=self.stdout, stderr=self.stderr, stdin=sys.stdin)
        try:
            code = up.run(
                port=port,
                ticketdesk_port=ticketdesk_port,
                no_worker=no_worker,
                verbosity=options["verbosity"],
            )
        except embedded_db.LaunchError as error:
            raise CommandError(str(error)) from error
        if code:
            sys.exit(code)
