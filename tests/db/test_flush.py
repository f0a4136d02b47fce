"""``manage.py flush`` between transactional tests empties every tenant's rows.

The suite's flush deletes rows as the superuser with the triggers off instead of
truncating (portal/management/commands/flush.py): it must leave no row behind in
any table, whichever tenant's it is and whatever partition holds it, or the next
transactional test would start on another's data.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from guardian.conf import settings as guardian_settings

from audit import services as audit_services
from audit.models import EventCode
from portal import scope
from portal.actors import Actor
from tests.support.db import connect_as

# post_migrate makes these again after every flush, as Django's own flush does.
REMADE_AFTER_FLUSH = {"auth_permission", "django_content_type", "django_migrations"}


def _count(admin: psycopg.Connection[Any], sql: str, *params: Any) -> int:
    row = admin.execute(sql, params or None).fetchone()
    assert row is not None
    return int(row[0])


def _row_counts() -> dict[str, int]:
    """Rows in every table of the schema, read as the superuser (past RLS)."""
    with connect_as("admin") as admin:
        tables = [
            name
            for (name,) in admin.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
                " AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            )
        ]
        counts = {
            table: _count(admin, f'SELECT count(*) FROM "{table}"') for table in tables
        }
        # django-guardian's post_migrate makes its anonymous user again; any other
        # account left behind counts.
        counts["auth_user"] = _count(
            admin,
            "SELECT count(*) FROM auth_user WHERE username <> %s",
            guardian_settings.ANONYMOUS_USER_NAME,
        )
        return counts


@pytest.mark.django_db(transaction=True)
def test_the_flush_leaves_no_row_of_any_tenant(make_tenant, make_agent, make_task):
    # given two tenants, each with an agent, a task and an event in its trail
    for _ in range(2):
        tenant = make_tenant()
        agent = make_agent(tenant=tenant)
        task = make_task(tenant=tenant)
        with scope.tenant_scope([tenant.pk]), transaction.atomic():
            audit_services.event_append(
                tenant_id=tenant.pk,
                code=EventCode.TASK_REGISTERED,
                actor=Actor.of_agent(agent),
                task_id=task.pk,
                data={},
            )
    before = _row_counts()
    assert before["audit_event"] >= 2 and before["portal_tenant"] >= 2
    # when the suite's flush runs
    call_command(
        "flush", interactive=False, reset_sequences=False, verbosity=0,
        database=connection.alias,
    )  # fmt: skip
    # then every table is empty but those post_migrate fills again
    left = {t: n for t, n in _row_counts().items() if n and t not in REMADE_AFTER_FLUSH}
    assert left == {}
