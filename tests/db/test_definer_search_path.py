"""Every SECURITY DEFINER function ends its search_path with pg_temp (issue 19 §1).

A definer function runs with its owner's rights. With ``search_path = pg_catalog,
public`` PostgreSQL still searches the caller's temporary schema, and searches it
*first* for tables: a caller's ``CREATE TEMP TABLE portal_membership`` shadowed the
real one in ``portal_person_tenants``, which then returned a forged tenant id.
Naming ``pg_temp`` last puts it behind ``public`` (tenant_deletion migration 0001).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from django.db import connection

from portal import db_roles
from tests.support.db import connect_as

pytestmark = pytest.mark.django_db(transaction=True)

# Definer functions of the schema whose search_path does not end with pg_temp.
NOT_PG_TEMP_LAST = """
SELECT p.oid::regprocedure::text, array_to_string(p.proconfig, ',')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.prosecdef
  AND NOT EXISTS (
      SELECT 1 FROM unnest(p.proconfig) AS c(setting)
      WHERE c.setting ~ '^search_path=.*\\mpg_temp"?$'
  )
ORDER BY 1
"""


def _not_pg_temp_last(cursor: Any) -> list[tuple[str, str]]:
    cursor.execute(NOT_PG_TEMP_LAST)
    return list(cursor.fetchall())


def test_every_definer_function_ends_its_search_path_with_pg_temp():
    with connection.cursor() as cursor:
        assert _not_pg_temp_last(cursor) == []
        cursor.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n"
            " ON n.oid = p.pronamespace WHERE n.nspname = 'public' AND p.prosecdef"
        )
        assert cursor.fetchone()[0] >= 15  # the check looked at something


def test_the_catalog_check_fails_for_a_definer_without_pg_temp():
    """What the check says about a function a future migration forgets it in."""
    with connect_as("owner") as owner, owner.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION probe_definer() RETURNS int LANGUAGE sql"
            " SECURITY DEFINER SET search_path = pg_catalog, public AS 'SELECT 1'"
        )
        cursor.execute(
            "CREATE FUNCTION probe_definer_none() RETURNS int LANGUAGE sql"
            " SECURITY DEFINER AS 'SELECT 1'"
        )
        assert _not_pg_temp_last(cursor) == [
            ("probe_definer()", "search_path=pg_catalog, public"),
            ("probe_definer_none()", None),
        ]
        owner.rollback()


def _person_tenants_with_a_temp_membership(conn: psycopg.Connection) -> list[Any]:
    """As the app role: a temporary portal_membership naming a forged tenant for
    user 424242, then ask the discovery function for that user's tenants (whether
    the forged one came back, how many)."""
    forged = uuid.uuid4()
    conn.execute(
        "CREATE TEMP TABLE portal_membership (tenant_id uuid, user_id integer)"
        " ON COMMIT DROP"
    )
    conn.execute("INSERT INTO portal_membership VALUES (%s, 424242)", [forged])
    # Its owner lets the function's owner read it, as a forger would.
    conn.execute(f"GRANT SELECT ON portal_membership TO {db_roles.DISCOVERY_ROLE}")
    rows = conn.execute("SELECT * FROM portal_person_tenants(424242)").fetchall()
    return [forged in {row[0] for row in rows}, len(rows)]


def test_a_callers_temp_table_does_not_shadow_a_real_one():
    with connect_as("app") as app:
        assert _person_tenants_with_a_temp_membership(app) == [False, 0]


def test_without_pg_temp_last_the_temp_table_did_shadow_it():
    """The test above can fail: with the old search_path the forged id comes back."""
    with connect_as("admin") as admin:
        admin.execute(
            "ALTER FUNCTION portal_person_tenants(integer)"
            " SET search_path = pg_catalog, public"
        )
        admin.execute("SET LOCAL ROLE portal_app")
        assert _person_tenants_with_a_temp_membership(admin) == [True, 1]
        admin.rollback()
