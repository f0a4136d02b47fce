"""Events are append-only and bounded (docs/architecture.md, invariants 5 and 7);
outbox rows stay in tenant.

The one exception to append-only is the purge path in
``tenant_deletion/services.py``, which sets ``portal.purge`` for its own transaction
(as django-pgtrigger's "ignore" does).
"""

from __future__ import annotations

from django.db import migrations

EVENT_PAYLOAD_MAX_BYTES = 8192  # copy of settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES

FORWARD = f"""
ALTER TABLE audit_outbox ADD CONSTRAINT audit_outbox_event_same_tenant_fk
    FOREIGN KEY (tenant_id, event_id) REFERENCES audit_event (tenant_id, id);
-- One downstream message per event; also the index behind the foreign key.
ALTER TABLE audit_outbox ADD CONSTRAINT audit_outbox_event_uniq
    UNIQUE (tenant_id, event_id);

ALTER TABLE audit_event ADD CONSTRAINT audit_event_payload_size_check
    CHECK (octet_length(payload::text) <= {EVENT_PAYLOAD_MAX_BYTES});

CREATE FUNCTION audit_event_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('portal.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit events are append-only (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'audit_event_append_only_trg';
END $$;
CREATE TRIGGER audit_event_append_only_trg BEFORE UPDATE OR DELETE ON audit_event
    FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
"""

REVERSE = """
DROP TRIGGER audit_event_append_only_trg ON audit_event;
DROP FUNCTION audit_event_append_only();
ALTER TABLE audit_event DROP CONSTRAINT audit_event_payload_size_check;
ALTER TABLE audit_outbox DROP CONSTRAINT audit_outbox_event_uniq;
ALTER TABLE audit_outbox DROP CONSTRAINT audit_outbox_event_same_tenant_fk;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0001_initial"),
        ("portal", "0002_clock_and_composite_keys"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
