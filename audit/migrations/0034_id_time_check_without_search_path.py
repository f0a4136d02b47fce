"""``audit_event_id_time_ok`` (0032) reads the id's time without the search path.

0032's PL/pgSQL body called ``audit_uuid7_time`` by name, and a PL/pgSQL body looks
its names up in the caller's ``search_path`` when it runs. ``pg_restore`` loads the
rows with an empty ``search_path``, so every COPY into ``audit_event`` failed its
CHECK with "function audit_uuid7_time(uuid) does not exist"
(``tests/deploy/test_restore_drill.py`` found it). The body now computes the time
with the same expression as ``audit_uuid7_time`` (0011) written with ``pg_catalog``
functions only, which every search path reaches; the CHECK and its cost stay.
"""

from __future__ import annotations

import importlib

from django.db import migrations

_previous = importlib.import_module("audit.migrations.0032_state_and_actor_type_domains")

ID_TIME_OK = """
CREATE OR REPLACE FUNCTION audit_event_id_time_ok(
    p_id uuid, p_created_at timestamptz, p_tolerance interval
) RETURNS boolean
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
DECLARE
    -- audit_uuid7_time(p_id) (migration 0011), by pg_catalog's functions alone.
    v_at timestamptz := pg_catalog.to_timestamp(
        ('x' || pg_catalog.lpad(pg_catalog.substr(
            pg_catalog.replace(p_id::text, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint
        / 1000.0);
BEGIN
    RETURN p_created_at > v_at - p_tolerance AND p_created_at < v_at + p_tolerance;
END $$;
"""


def _create_or_replace(statement: str) -> str:
    return statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


# Back to 0032's body.
ID_TIME_OK_REVERSE = _create_or_replace(
    _previous.ID_TIME_FORWARD.split("COMMENT ON FUNCTION", 1)[0]
)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0033_event_payload_domain"),
    ]

    operations = [
        migrations.RunSQL(ID_TIME_OK, ID_TIME_OK_REVERSE),
    ]
