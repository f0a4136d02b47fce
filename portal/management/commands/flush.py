"""``manage.py flush`` as the schema owner (the test suite's transactional tests).

Emptying the audit trail, the outbox and the operations takes ``TRUNCATE``, which
the app role is not granted and their ``BEFORE TRUNCATE`` triggers refuse to anyone
but the owner (docs/database-roles.md).
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands.flush import Command as DjangoFlush

from portal import db_roles


class Command(DjangoFlush):
    def handle(self, **options: Any) -> None:
        with db_roles.connected_as(options["database"], db_roles.owner_url()):
            super().handle(**options)
