"""``manage.py checkpoint_audit``: sign every event chain head that moved.

Beat runs the same as ``audit.jobs.checkpoint_audit_job`` every minute; this command
is for a first checkpoint, a cron without beat, and tests.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit import checkpoints


class Command(BaseCommand):
    help = "Sign every audit event chain head that moved since its last checkpoint."

    def handle(self, *args: Any, **options: Any) -> None:
        key = checkpoints.signing_key()
        written = checkpoints.unscoped_checkpoint_all(key=key)
        self.stdout.write(
            f"signed {sum(written.values())} chain heads in {len(written)} tenants "
            f"with key {key.key_id}"
        )
