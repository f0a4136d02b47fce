"""``manage.py witness --state-dir DIR --key-file F --log-key PEM --listen HOST:PORT``.

Runs a transparency-log witness (audit/witness.py, docs/audit-integrity.md,
"Witnesses"): its own Ed25519 key (made on first start when the file is missing),
its state in files under ``--state-dir``, never the portal's database. It prints
its verifier key (what ``PORTAL_AUDIT_WITNESSES`` and the verifiers' ``--witness-key``
take) and serves until stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit import tlog, witness


class Command(BaseCommand):
    help = "Run a C2SP tlog-witness that cosigns the portal's tree heads."
    requires_system_checks: list[str] = []  # no database, no app checks

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--state-dir", required=True, type=Path)
        parser.add_argument("--key-file", required=True, type=Path)
        parser.add_argument(
            "--log-key",
            action="append",
            default=[],
            metavar="PEM",
            help="the log's (portal's) public key file; repeatable; default: the "
            "published one (PORTAL_AUDIT_PUBLIC_KEY_FILE or the development key's)",
        )
        parser.add_argument("--name", default="witness.local/portal-dev")
        parser.add_argument("--origin-prefix", default=tlog.ORIGIN_PREFIX)
        parser.add_argument("--listen", default="127.0.0.1:7380", metavar="HOST:PORT")
        parser.add_argument(
            "--print-key",
            action="store_true",
            help="print the verifier key and exit",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def write(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        try:
            witness.run(
                name=options["name"],
                key_file=options["key_file"],
                state_dir=options["state_dir"],
                log_key_files=options["log_key"] or [self._published_key_file()],
                listen=options["listen"],
                origin_prefix=options["origin_prefix"],
                print_key=options["print_key"],
                write=write,
            )
        except (OSError, ValueError) as error:
            raise CommandError(str(error)) from error

    @staticmethod
    def _published_key_file() -> str:
        from django.conf import settings

        return str(
            settings.PORTAL_AUDIT_PUBLIC_KEY_FILE
            or settings.PORTAL_AUDIT_DEV_PUBLIC_KEY_FILE
        )
