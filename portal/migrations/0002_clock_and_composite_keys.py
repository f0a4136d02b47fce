"""The one SQL clock, and the composite foreign keys of the portal app.

``app_now()`` is the clock for every lease and expiry comparison. It is the statement
time, shifted by the ``portal.clock_offset`` setting that only tests set, so Python and
SQL agree on time in tests that move it (docs/invariants.md, "The one clock").
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE FUNCTION app_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT statement_timestamp() + COALESCE(
        NULLIF(current_setting('portal.clock_offset', true), '')::interval,
        interval '0'
    )
$$;

ALTER TABLE portal_agentkey ADD CONSTRAINT portal_agentkey_agent_same_tenant_fk
    FOREIGN KEY (tenant_id, agent_id) REFERENCES portal_agent (tenant_id, id);
CREATE INDEX portal_agentkey_agent_idx ON portal_agentkey (tenant_id, agent_id);
"""

REVERSE = """
DROP INDEX portal_agentkey_agent_idx;
ALTER TABLE portal_agentkey DROP CONSTRAINT portal_agentkey_agent_same_tenant_fk;
DROP FUNCTION app_now();
"""


class Migration(migrations.Migration):
    dependencies = [("portal", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
