"""Database invariants Django cannot express (docs/architecture.md, 1, 3, 6 and 8).

Constants are copied in, not imported (docs/style.md R7); tests/db/test_transitions.py
proves these tables equal ``TASK_TRANSITIONS`` and ``OPERATION_TRANSITIONS``.
Every trigger raises with a CONSTRAINT name, so errors translate like constraints.
"""

from __future__ import annotations

from django.db import migrations

TASK_TRANSITIONS = """
    ('pending', 'running'), ('pending', 'cancelled'), ('pending', 'human_required'),
    ('running', 'waiting'), ('running', 'pending'), ('running', 'succeeded'),
    ('running', 'failed'), ('running', 'cancelled'), ('running', 'human_required'),
    ('waiting', 'pending'), ('waiting', 'cancelled'), ('waiting', 'human_required'),
    ('human_required', 'human_claimed'),
    ('human_claimed', 'human_required'), ('human_claimed', 'succeeded'),
    ('human_claimed', 'failed'), ('human_claimed', 'cancelled'),
    ('human_claimed', 'pending')
"""

OPERATION_TRANSITIONS = """
    ('reserved', 'executing'), ('reserved', 'failed'), ('reserved', 'human_required'),
    ('executing', 'verified'), ('executing', 'failed'), ('executing', 'unknown'),
    ('unknown', 'verified'), ('unknown', 'failed'), ('unknown', 'executing'),
    ('unknown', 'conflict'), ('unknown', 'human_required'),
    ('human_required', 'executing'), ('human_required', 'verified'),
    ('human_required', 'failed'),
    ('conflict', 'verified'), ('conflict', 'failed')
"""

FORWARD = f"""
-- Invariant 1: children point at parents of the same tenant.
ALTER TABLE tasks_operation ADD CONSTRAINT tasks_operation_task_same_tenant_fk
    FOREIGN KEY (tenant_id, task_id) REFERENCES tasks_task (tenant_id, id);
ALTER TABLE tasks_credential ADD CONSTRAINT tasks_credential_operation_same_tenant_fk
    FOREIGN KEY (tenant_id, operation_id) REFERENCES tasks_operation (tenant_id, id);
CREATE INDEX tasks_credential_operation_idx ON tasks_credential (tenant_id, operation_id);
ALTER TABLE tasks_task ADD CONSTRAINT tasks_task_contract_same_tenant_fk
    FOREIGN KEY (tenant_id, contract_key, contract_version)
    REFERENCES tasks_contract (tenant_id, key, version);

-- Invariants 3 and 6 for tasks: legal transitions only; state_version rises by
-- exactly one with every change of state, step, reason or wake-up; the fencing
-- token never falls.
CREATE FUNCTION tasks_task_guard_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> OLD.state AND (OLD.state, NEW.state) NOT IN ({TASK_TRANSITIONS}) THEN
        RAISE EXCEPTION 'task %: % -> % is not a legal transition',
                OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'tasks_task_transition_trg';
    END IF;
    IF (NEW.state, NEW.current_step, NEW.reason_code, NEW.wake_at, NEW.state_version)
        IS DISTINCT FROM
       (OLD.state, OLD.current_step, OLD.reason_code, OLD.wake_at, OLD.state_version)
       AND NEW.state_version <> OLD.state_version + 1 THEN
        RAISE EXCEPTION 'task %: state_version must rise by exactly one (% -> %)',
                OLD.id, OLD.state_version, NEW.state_version
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'tasks_task_state_version_trg';
    END IF;
    IF NEW.lease_token < OLD.lease_token THEN
        RAISE EXCEPTION 'task %: fencing token may not fall (% -> %)',
                OLD.id, OLD.lease_token, NEW.lease_token
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'tasks_task_lease_token_trg';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tasks_task_guard_trg BEFORE UPDATE ON tasks_task
    FOR EACH ROW EXECUTE FUNCTION tasks_task_guard_update();

-- Invariant 3 for operations.
CREATE FUNCTION tasks_operation_guard_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> OLD.state
       AND (OLD.state, NEW.state) NOT IN ({OPERATION_TRANSITIONS}) THEN
        RAISE EXCEPTION 'operation %: % -> % is not a legal transition',
                OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'tasks_operation_transition_trg';
    END IF;
    IF (NEW.state, NEW.state_version) IS DISTINCT FROM (OLD.state, OLD.state_version)
       AND NEW.state_version <> OLD.state_version + 1 THEN
        RAISE EXCEPTION 'operation %: state_version must rise by exactly one (% -> %)',
                OLD.id, OLD.state_version, NEW.state_version
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'tasks_operation_state_version_trg';
    END IF;
    IF (NEW.tenant_id, NEW.idempotency_key, NEW.input_hash, NEW.action, NEW.target)
       IS DISTINCT FROM
       (OLD.tenant_id, OLD.idempotency_key, OLD.input_hash, OLD.action, OLD.target) THEN
        RAISE EXCEPTION 'operation %: its identity (key, input, action, target) is fixed',
                OLD.id
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'tasks_operation_identity_trg';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tasks_operation_guard_trg BEFORE UPDATE ON tasks_operation
    FOR EACH ROW EXECUTE FUNCTION tasks_operation_guard_update();

-- Invariant 8: a published contract version never changes; it can only be retired.
-- Deleting one is the tenant purge's privilege (audit/retention.py), nobody else's.
CREATE FUNCTION tasks_contract_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'draft' THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF current_setting('portal.purge', true) = 'on' THEN
            RETURN OLD;
        END IF;
    ELSIF (NEW.tenant_id, NEW.key, NEW.version, NEW.spec, NEW.created_at,
           NEW.published_at)
          IS NOT DISTINCT FROM
          (OLD.tenant_id, OLD.key, OLD.version, OLD.spec, OLD.created_at,
           OLD.published_at)
      AND (NEW.status = OLD.status AND NEW.retired_at IS NOT DISTINCT FROM OLD.retired_at
           OR OLD.status = 'published' AND NEW.status = 'retired') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'contract % v%: published versions are immutable (% refused)',
            OLD.key, OLD.version, TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'tasks_contract_immutable_trg';
END $$;
CREATE TRIGGER tasks_contract_immutable_trg BEFORE UPDATE OR DELETE ON tasks_contract
    FOR EACH ROW EXECUTE FUNCTION tasks_contract_guard();
"""

REVERSE = """
DROP TRIGGER tasks_contract_immutable_trg ON tasks_contract;
DROP FUNCTION tasks_contract_guard();
DROP TRIGGER tasks_operation_guard_trg ON tasks_operation;
DROP FUNCTION tasks_operation_guard_update();
DROP TRIGGER tasks_task_guard_trg ON tasks_task;
DROP FUNCTION tasks_task_guard_update();
ALTER TABLE tasks_task DROP CONSTRAINT tasks_task_contract_same_tenant_fk;
DROP INDEX tasks_credential_operation_idx;
ALTER TABLE tasks_credential DROP CONSTRAINT tasks_credential_operation_same_tenant_fk;
ALTER TABLE tasks_operation DROP CONSTRAINT tasks_operation_task_same_tenant_fk;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0001_initial"),
        ("portal", "0002_clock_and_composite_keys"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
