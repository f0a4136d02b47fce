"""Retention's owner-only path (docs/retention.md, audit/retention.py).

Three ``SECURITY DEFINER`` functions, owned by the migrating (owner) role, are the
only way to remove audit data; the app role gets nothing but EXECUTE on them:

- ``audit_retention_purge(tenant, purge_id, default_months)``: removes one tenant's
  events that its policy expired, records the purge (``audit_retentionpurge``) and,
  per chain it cut, the last removed event's hash (``audit_retentionanchor``); the
  caller appends the tombstone event in the same transaction.
- ``audit_retention_drop_partitions(default_months)``: detaches and drops the month
  partitions every tenant's policy expired, once each tenant with rows in one has
  a purge record covering it.
- ``audit_retention_drop_payloads(tenant, default_days)``: sets expired payloads of
  chain format v2 events to NULL; their ``payload_digest`` stays, so the chain
  still verifies.

Row deletes and payload drops need the append-only trigger out of the way: the
function disables it on the one partition it works on, inside its own transaction
(DDL only the owner may do, so no session setting can open it), and enables it
again before returning. Other sessions never see it disabled (catalog changes are
transactional); the partition's writers wait for the statement (SHARE ROW EXCLUSIVE).

``audit_event_chain_head`` learns the anchors: a chain whose every event was purged
continues from its anchor instead of starting again at #1.
"""

from __future__ import annotations

from django.db import migrations

# The checkpoint run's advisory lock key (audit/checkpoints.py): a purge waits for
# a checkpoint run of its tenant and the other way round.
CHECKPOINT_LOCK = "audit.checkpoint:"

FORWARD = f"""
-- A dropped payload is NULL (the model keeps NOT NULL for writers, see Event).
ALTER TABLE audit_event ALTER COLUMN payload DROP NOT NULL;
CREATE FUNCTION audit_retention_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Only the owner, i.e. the app role inside the owner's definer purge
    -- (tasks_purge_tenant_rows); no session setting opens it.
    IF TG_OP = 'DELETE' AND portal_current_user_owns(TG_RELID) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'audit_retention_append_only_trg';
END $$;
CREATE TRIGGER audit_retention_append_only_trg
    BEFORE UPDATE OR DELETE ON audit_retentionpurge
    FOR EACH ROW EXECUTE FUNCTION audit_retention_append_only();
CREATE TRIGGER audit_retention_append_only_trg
    BEFORE UPDATE OR DELETE ON audit_retentionanchor
    FOR EACH ROW EXECUTE FUNCTION audit_retention_append_only();

CREATE OR REPLACE FUNCTION audit_event_chain_head(
    p_tenant uuid, p_task uuid, OUT head_seq bigint, OUT head_hash text
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_task IS NULL THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended('audit.chain:tenant:' || p_tenant::text, 0));
        SELECT e.chain_seq, e.hash INTO head_seq, head_hash FROM audit_event e
        WHERE e.tenant_id = p_tenant AND e.task_id IS NULL
          AND e.chain_seq IS NOT NULL
        ORDER BY e.chain_seq DESC LIMIT 1;
        IF head_seq IS NULL THEN
            SELECT a.seq, a.hash INTO head_seq, head_hash
            FROM audit_retentionanchor a
            WHERE a.tenant_id = p_tenant AND a.task_id IS NULL
            ORDER BY a.seq DESC LIMIT 1;
        END IF;
    ELSE
        PERFORM pg_advisory_xact_lock(
            hashtextextended('audit.chain:task:' || p_task::text, 0));
        SELECT e.chain_seq, e.hash INTO head_seq, head_hash FROM audit_event e
        WHERE e.tenant_id = p_tenant AND e.task_id = p_task
          AND e.chain_seq IS NOT NULL
        ORDER BY e.chain_seq DESC LIMIT 1;
        IF head_seq IS NULL THEN
            SELECT a.seq, a.hash INTO head_seq, head_hash
            FROM audit_retentionanchor a
            WHERE a.tenant_id = p_tenant AND a.task_id = p_task
            ORDER BY a.seq DESC LIMIT 1;
        END IF;
    END IF;
END $$;

-- The id below which one tenant's events are expired: the start of the month
-- p_months before the current one (app_now(), UTC), but never into the current
-- month of the real clock, nor past an event whose outbox message is still
-- undelivered (pending or dead).
CREATE FUNCTION audit_retention_horizon(p_tenant uuid, p_default_months integer)
RETURNS uuid LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
DECLARE
    v_months integer;
    v_before uuid;
    v_held uuid;
BEGIN
    SELECT event_months INTO v_months FROM audit_retentionpolicy
    WHERE tenant_id = p_tenant;
    v_months := coalesce(v_months, p_default_months);
    IF v_months IS NULL OR v_months < 1 THEN
        RAISE EXCEPTION 'retention must keep at least one month, not %', v_months;
    END IF;
    v_before := audit_uuid7_floor(
        (date_trunc('month', app_now() AT TIME ZONE 'UTC')
         - make_interval(months => v_months)) AT TIME ZONE 'UTC');
    -- Never the month being written (whatever the test clock says): new events
    -- and this purge's own tombstone land there.
    v_held := audit_uuid7_floor(
        date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC');
    IF v_held < v_before THEN
        v_before := v_held;
    END IF;
    SELECT o.event_id INTO v_held FROM audit_outbox o
    WHERE o.tenant_id = p_tenant AND o.state IN ('pending', 'dead')
    ORDER BY o.event_id LIMIT 1;
    IF v_held IS NOT NULL AND v_held < v_before THEN
        v_before := v_held;
    END IF;
    RETURN v_before;
END $$;

-- The id below which every tenant's events are expired (month partitions wholly
-- below it can be dropped).
CREATE FUNCTION audit_retention_global_horizon(p_default_months integer)
RETURNS uuid LANGUAGE sql STABLE SET search_path = public, pg_temp AS $$
SELECT h FROM (
    SELECT audit_retention_horizon(t.id, p_default_months) AS h FROM portal_tenant t
) horizons ORDER BY h LIMIT 1
$$;

-- Run p_sql (with %I for the partition) on one partition with the append-only
-- trigger disabled, restoring its previous firing mode afterwards.
CREATE FUNCTION audit_retention_unguarded(p_partition text, p_sql text)
RETURNS bigint LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    v_mode "char";
    v_rows bigint;
BEGIN
    SELECT tgenabled INTO v_mode FROM pg_trigger
    WHERE tgrelid = p_partition::regclass AND tgname = 'audit_event_append_only_trg';
    EXECUTE format('ALTER TABLE %I DISABLE TRIGGER audit_event_append_only_trg',
                   p_partition);
    EXECUTE format(p_sql, p_partition);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    EXECUTE format('ALTER TABLE %I ENABLE %s TRIGGER audit_event_append_only_trg',
                   p_partition,
                   CASE v_mode WHEN 'A' THEN 'ALWAYS' WHEN 'R' THEN 'REPLICA'
                        ELSE '' END);
    RETURN v_rows;
END $$;
REVOKE ALL ON FUNCTION audit_retention_unguarded(text, text) FROM PUBLIC;

CREATE FUNCTION audit_retention_purge(
    p_tenant uuid, p_purge uuid, p_default_months integer,
    OUT before_id uuid, OUT events bigint, OUT first_event_id uuid,
    OUT last_event_id uuid, OUT anchors bigint, OUT deleted bigint
) LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_global uuid := audit_retention_global_horizon(p_default_months);
    v_part record;
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended('{CHECKPOINT_LOCK}' || p_tenant::text, 0));
    before_id := audit_retention_horizon(p_tenant, p_default_months);
    SELECT count(*), min(e.id::text)::uuid, max(e.id::text)::uuid
    INTO events, first_event_id, last_event_id
    FROM audit_event e WHERE e.tenant_id = p_tenant AND e.id < before_id;
    anchors := 0;
    deleted := 0;
    IF events = 0 THEN
        RETURN;
    END IF;
    INSERT INTO audit_retentionpurge (
        id, tenant_id, before_id, events, first_event_id, last_event_id, purged_at
    ) VALUES (p_purge, p_tenant, before_id, events, first_event_id, last_event_id,
              now());
    INSERT INTO audit_retentionanchor (
        tenant_id, purge_id, task_id, seq, event_id, hash
    )
    SELECT DISTINCT ON (e.task_id) e.tenant_id, p_purge, e.task_id, e.chain_seq,
        e.id, e.hash
    FROM audit_event e
    WHERE e.tenant_id = p_tenant AND e.id < before_id AND e.chain_seq IS NOT NULL
    ORDER BY e.task_id, e.chain_seq DESC;
    GET DIAGNOSTICS anchors = ROW_COUNT;
    -- Their delivered messages go with them (the composite key would refuse).
    DELETE FROM audit_outbox o
    WHERE o.tenant_id = p_tenant AND o.event_id < before_id;
    -- Rows in partitions every tenant has expired go with the partition
    -- (audit_retention_drop_partitions); the rest are deleted here.
    FOR v_part IN
        SELECT p.name FROM audit_event_partitions() p
        WHERE (p.lower_id IS NULL OR p.lower_id < before_id)
          AND NOT (p.upper_id <= v_global)
    LOOP
        deleted := deleted + audit_retention_unguarded(v_part.name, format(
            'DELETE FROM %%I WHERE tenant_id = %L AND id < %L', p_tenant, before_id));
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION audit_retention_purge(uuid, uuid, integer) FROM PUBLIC;

CREATE FUNCTION audit_retention_drop_partitions(p_default_months integer)
RETURNS SETOF text LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp AS $$
DECLARE
    v_global uuid := audit_retention_global_horizon(p_default_months);
    v_part record;
    v_uncovered uuid;
BEGIN
    FOR v_part IN
        SELECT p.name, p.upper_id FROM audit_event_partitions() p
        WHERE p.upper_id <= v_global
    LOOP
        -- Every tenant with rows here must have a purge (and so a tombstone)
        -- that covers them; otherwise this partition waits for the next run.
        EXECUTE format(
            'SELECT e.tenant_id FROM %I e WHERE NOT EXISTS ('
            ' SELECT 1 FROM audit_retentionpurge r WHERE r.tenant_id = e.tenant_id'
            ' AND r.before_id >= %L) LIMIT 1', v_part.name, v_part.upper_id)
        INTO v_uncovered;
        CONTINUE WHEN v_uncovered IS NOT NULL;
        EXECUTE format('ALTER TABLE audit_event DETACH PARTITION %I', v_part.name);
        EXECUTE format('DROP TABLE %I', v_part.name);
        RETURN NEXT v_part.name;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION audit_retention_drop_partitions(integer) FROM PUBLIC;

CREATE FUNCTION audit_retention_drop_payloads(
    p_tenant uuid, p_default_days integer,
    OUT before_id uuid, OUT dropped bigint
) LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_days integer;
    v_part record;
BEGIN
    SELECT payload_days INTO v_days FROM audit_retentionpolicy
    WHERE tenant_id = p_tenant;
    v_days := coalesce(v_days, p_default_days);
    IF v_days IS NULL OR v_days < 1 THEN
        RAISE EXCEPTION 'payloads must be kept at least one day, not %', v_days;
    END IF;
    before_id := audit_uuid7_floor(
        (date_trunc('day', app_now() AT TIME ZONE 'UTC')
         - make_interval(days => v_days)) AT TIME ZONE 'UTC');
    dropped := 0;
    FOR v_part IN
        SELECT p.name FROM audit_event_partitions() p
        WHERE p.lower_id IS NULL OR p.lower_id < before_id
    LOOP
        -- Only v2 events: their hash covers the digest, not the payload.
        dropped := dropped + audit_retention_unguarded(v_part.name, format(
            'UPDATE %%I SET payload = NULL WHERE tenant_id = %L AND id < %L'
            ' AND payload IS NOT NULL AND payload_digest IS NOT NULL'
            ' AND code <> ''audit.purged''',  -- the tombstone's record is its payload
            p_tenant, before_id));
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION audit_retention_drop_payloads(uuid, integer) FROM PUBLIC;
"""

REVERSE = """
CREATE OR REPLACE FUNCTION audit_event_chain_head(
    p_tenant uuid, p_task uuid, OUT head_seq bigint, OUT head_hash text
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_task IS NULL THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended('audit.chain:tenant:' || p_tenant::text, 0));
        SELECT e.chain_seq, e.hash INTO head_seq, head_hash FROM audit_event e
        WHERE e.tenant_id = p_tenant AND e.task_id IS NULL
          AND e.chain_seq IS NOT NULL
        ORDER BY e.chain_seq DESC LIMIT 1;
    ELSE
        PERFORM pg_advisory_xact_lock(
            hashtextextended('audit.chain:task:' || p_task::text, 0));
        SELECT e.chain_seq, e.hash INTO head_seq, head_hash FROM audit_event e
        WHERE e.tenant_id = p_tenant AND e.task_id = p_task
          AND e.chain_seq IS NOT NULL
        ORDER BY e.chain_seq DESC LIMIT 1;
    END IF;
END $$;
DROP FUNCTION audit_retention_drop_payloads(uuid, integer);
DROP FUNCTION audit_retention_drop_partitions(integer);
DROP FUNCTION audit_retention_purge(uuid, uuid, integer);
DROP FUNCTION audit_retention_unguarded(text, text);
DROP FUNCTION audit_retention_global_horizon(integer);
DROP FUNCTION audit_retention_horizon(uuid, integer);
DROP TRIGGER audit_retention_append_only_trg ON audit_retentionanchor;
DROP TRIGGER audit_retention_append_only_trg ON audit_retentionpurge;
DROP FUNCTION audit_retention_append_only();
ALTER TABLE audit_event ALTER COLUMN payload SET NOT NULL;
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0012_retention")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
