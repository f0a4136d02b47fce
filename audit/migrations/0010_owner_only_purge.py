"""Events and checkpoints: deleted only by the owner; events and outbox never truncated.

Before, a transaction that set ``portal.purge`` could delete events, and any session
may set any ``portal.*`` setting. Now the triggers let a row go only when the current
user owns the table: the owner itself, or the app role inside the owner's
``SECURITY DEFINER`` purge function (tasks migration 0011). ``BEFORE TRUNCATE``
triggers stop the statement that skips row triggers altogether.
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION audit_event_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND portal_current_user_owns(TG_RELID) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit events are append-only (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'audit_event_append_only_trg';
END $$;

CREATE OR REPLACE FUNCTION audit_checkpoint_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND portal_current_user_owns(TG_RELID) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit checkpoints are append-only (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'audit_checkpoint_append_only_trg';
END $$;

CREATE TRIGGER audit_event_truncate_trg BEFORE TRUNCATE ON audit_event
    FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();
CREATE TRIGGER audit_outbox_truncate_trg BEFORE TRUNCATE ON audit_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();
"""

REVERSE = """
DROP TRIGGER audit_outbox_truncate_trg ON audit_outbox;
DROP TRIGGER audit_event_truncate_trg ON audit_event;
CREATE OR REPLACE FUNCTION audit_checkpoint_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('portal.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit checkpoints are append-only (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'audit_checkpoint_append_only_trg';
END $$;
CREATE OR REPLACE FUNCTION audit_event_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('portal.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit events are append-only (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'audit_event_append_only_trg';
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0009_event_hash_chain"),
        ("portal", "0007_owner_only_clock_and_truncate_guard"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
