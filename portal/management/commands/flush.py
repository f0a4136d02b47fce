"""``manage.py flush`` for the test suite's transactional tests.

Emptying the audit trail, the outbox and the operations takes more than the app role
may do: it holds no ``TRUNCATE``, and the tables' ``BEFORE TRUNCATE``/``DELETE``
triggers refuse anyone but the schema's owner (docs/database-roles.md).

Where ``DATABASE_URL`` names a superuser (the test suite and ``up`` start from an
administrator's URL), the rows are deleted with the triggers off
(``session_replication_role = replica``) and row-level security bypassed: after a
test most tables are empty or nearly, and a ``DELETE`` costs a fraction of a
millisecond where a ``TRUNCATE`` of every table, each partition and index given new
files, took about two seconds per test. The tables end up as empty either way; the
sequences are left as they are, as Django's own flush does for tests. Anywhere else
(a deployment's app-role URL, or a flush asked to reset the sequences) it is Django's
``TRUNCATE``, run as the owner.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.commands.flush import Command as DjangoFlush
from django.core.management.sql import emit_post_migrate_signal
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from portal import db_roles


class Command(DjangoFlush):
    def handle(self, **options: Any) -> None:
        alias = options["database"]
        quick = not options.get("reset_sequences", True) and not options["interactive"]
        if quick:
            with db_roles.connected_as(alias, settings.DATABASE_URL) as connection:
                if _is_superuser(connection):
                    _delete_every_row(connection)
                    if not options.get("inhibit_post_migrate", False):
                        emit_post_migrate_signal(options["verbosity"], False, alias)
                    return
        with db_roles.connected_as(alias, db_roles.owner_url()):
            super().handle(**options)


def _is_superuser(connection: BaseDatabaseWrapper) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = cursor.fetchone()
    return bool(row and row[0])


def _delete_every_row(connection: BaseDatabaseWrapper) -> None:
    """Every table Django knows, emptied in one transaction, triggers and FKs off."""
    tables = connection.introspection.django_table_names(
        only_existing=True, include_views=False
    )
    quote = connection.ops.quote_name
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        for table in tables:
            cursor.execute(f"DELETE FROM {quote(table)}")
