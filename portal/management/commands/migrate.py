"""``manage.py migrate`` as the schema owner, then the app role's grants.

Django's own command, connected as ``DATABASE_OWNER_URL``'s user for its run; the
app role's rights (``portal.db_roles.APP_GRANTS``) are re-applied afterwards, so a
table a migration adds is usable by the app at once and by nobody else's rules.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands.migrate import Command as DjangoMigrate

from portal import db_roles


class Command(DjangoMigrate):
    def handle(self, *args: Any, **options: Any) -> None:
        with db_roles.connected_as(
            options["database"], db_roles.owner_url()
        ) as connection:
            super().handle(*args, **options)
            with connection.cursor() as cursor:
                db_roles.grant_app_role(cursor, test_clock=False)
