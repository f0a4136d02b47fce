"""Owner-only privileges: the test clock and the TRUNCATE guard (docs/database-roles.md).

The test clock was a setting (``portal.clock_offset``) any session could set, so any
session could make an expired lease or credential look live. Now the offset lives in
``portal_test_clock``, one row per backend, which only the owner writes, through
``portal_set_clock_offset`` (``SECURITY DEFINER``; ``EXECUTE`` is granted to the app
role by the test suite alone). ``app_now()`` still costs nothing in production: it
reads the table only once this backend has called the function (the
``portal.test_clock`` hint, which alone moves nothing).

``portal_current_user_owns`` is how the append-only triggers recognise the owner, the
one role (through its definer functions) that may delete or truncate what they guard.
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE TABLE portal_test_clock (
    backend_pid integer PRIMARY KEY,
    clock_offset interval NOT NULL
);

CREATE FUNCTION portal_test_clock_offset() RETURNS interval
LANGUAGE sql STABLE PARALLEL RESTRICTED AS $$
    SELECT COALESCE(
        (SELECT c.clock_offset FROM portal_test_clock c
         WHERE c.backend_pid = pg_backend_pid()),
        interval '0'
    )
$$;

-- Inlined into each query; the table is read only after portal_set_clock_offset.
CREATE OR REPLACE FUNCTION app_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL RESTRICTED AS $$
    SELECT statement_timestamp() + CASE
        WHEN COALESCE(current_setting('portal.test_clock', true), '') = ''
            THEN interval '0'
        ELSE portal_test_clock_offset()
    END
$$;

CREATE FUNCTION portal_set_clock_offset(p_offset interval) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    -- Rows of backends that ended without a reset go too.
    DELETE FROM public.portal_test_clock c
    WHERE c.backend_pid = pg_backend_pid()
       OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = c.backend_pid);
    INSERT INTO public.portal_test_clock (backend_pid, clock_offset)
    VALUES (pg_backend_pid(), p_offset);
    PERFORM set_config('portal.test_clock', 'on', false);
END $$;

CREATE FUNCTION portal_reset_clock_offset() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    DELETE FROM public.portal_test_clock WHERE backend_pid = pg_backend_pid();
    PERFORM set_config('portal.test_clock', '', false);
END $$;

REVOKE EXECUTE ON FUNCTION portal_set_clock_offset(interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION portal_reset_clock_offset() FROM PUBLIC;

CREATE FUNCTION portal_current_user_owns(p_table oid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
        WHERE c.oid = p_table AND r.rolname = current_user
    )
$$;

-- BEFORE TRUNCATE, for each statement: only the owner (the test suite's flush).
CREATE FUNCTION portal_truncate_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF portal_current_user_owns(TG_RELID) THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION '% cannot be truncated', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege', CONSTRAINT = TG_NAME;
END $$;
"""

REVERSE = """
DROP FUNCTION portal_truncate_guard();
DROP FUNCTION portal_current_user_owns(oid);
DROP FUNCTION portal_reset_clock_offset();
DROP FUNCTION portal_set_clock_offset(interval);
CREATE OR REPLACE FUNCTION app_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT statement_timestamp() + COALESCE(
        NULLIF(current_setting('portal.clock_offset', true), '')::interval,
        interval '0'
    )
$$;
DROP FUNCTION portal_test_clock_offset();
DROP TABLE portal_test_clock;
"""


class Migration(migrations.Migration):
    dependencies = [("portal", "0006_membership_permissions")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
