"""Composite foreign keys for agent grants and idempotent requests (invariant 1)."""

from __future__ import annotations

from django.db import migrations

FORWARD = """
ALTER TABLE portal_agentgrant ADD CONSTRAINT portal_agentgrant_agent_same_tenant_fk
    FOREIGN KEY (tenant_id, agent_id) REFERENCES portal_agent (tenant_id, id);
ALTER TABLE portal_idempotentrequest
    ADD CONSTRAINT portal_idempotentrequest_agent_same_tenant_fk
    FOREIGN KEY (tenant_id, agent_id) REFERENCES portal_agent (tenant_id, id);
"""

REVERSE = """
ALTER TABLE portal_idempotentrequest
    DROP CONSTRAINT portal_idempotentrequest_agent_same_tenant_fk;
ALTER TABLE portal_agentgrant DROP CONSTRAINT portal_agentgrant_agent_same_tenant_fk;
"""


class Migration(migrations.Migration):
    dependencies = [("portal", "0003_grants_and_idempotent_requests")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
