-- What month partitions cost the event append, server side (docs/retention.md).
--
--   psql -h 127.0.0.1 -U postgres portal_bench -f bench/partition_costs.sql
--
-- Run on a database bench/run.py left behind (its events sit in
-- audit_event_legacy). Leaves nothing behind: temporary functions, and the outbox
-- loops roll back. Compare the timings within each group.
SELECT count(*) AS partitions FROM audit_event_partitions();

CREATE FUNCTION pg_temp.head_via_parent(p_tenant uuid, p_task uuid, p_n int)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE s bigint; h text;
BEGIN
    FOR i IN 1..p_n LOOP
        SELECT e.chain_seq, e.hash INTO s, h FROM audit_event e
        WHERE e.tenant_id = p_tenant AND e.task_id = p_task
          AND e.chain_seq IS NOT NULL ORDER BY e.chain_seq DESC LIMIT 1;
    END LOOP;
END $$;
CREATE FUNCTION pg_temp.head_via_legacy(p_tenant uuid, p_task uuid, p_n int)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE s bigint; h text;
BEGIN
    FOR i IN 1..p_n LOOP
        SELECT e.chain_seq, e.hash INTO s, h FROM audit_event_legacy e
        WHERE e.tenant_id = p_tenant AND e.task_id = p_task
          AND e.chain_seq IS NOT NULL ORDER BY e.chain_seq DESC LIMIT 1;
    END LOOP;
END $$;
CREATE FUNCTION pg_temp.outbox_rows(p_n int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE e record;
BEGIN
    SELECT x.tenant_id, x.id INTO e FROM audit_event_legacy x LIMIT 1;
    DELETE FROM audit_outbox WHERE event_id = e.id;
    FOR i IN 1..p_n LOOP
        INSERT INTO audit_outbox (id, tenant_id, event_id, topic, key, payload,
            state, attempts, last_error, available_at, created_at)
        VALUES (gen_random_uuid(), e.tenant_id, e.id, 't', 'cost-' || i, '{}',
            'sent', 0, '', now(), now());
        DELETE FROM audit_outbox WHERE tenant_id = e.tenant_id AND key = 'cost-' || i;
    END LOOP;
END $$;
SELECT tenant_id AS t, task_id AS k FROM audit_event_legacy
WHERE task_id IS NOT NULL LIMIT 1 \gset
\timing on

-- 1. 20,000 chain head lookups: through the partitioned parent, then on the one
-- partition that holds the rows.
SELECT pg_temp.head_via_parent(:'t', :'k', 20000);
SELECT pg_temp.head_via_legacy(:'t', :'k', 20000);

-- 2. 2,000 outbox rows onto one event, its foreign key onto the partitioned
-- audit_event checked each time: default plan cache; forced generic plans (what
-- event_append sets); without the foreign key.
BEGIN;
SELECT pg_temp.outbox_rows(2000);
ROLLBACK;
BEGIN;
SET LOCAL plan_cache_mode = force_generic_plan;
SELECT pg_temp.outbox_rows(2000);
ROLLBACK;
BEGIN;
ALTER TABLE audit_outbox DROP CONSTRAINT audit_outbox_event_same_tenant_fk;
SELECT pg_temp.outbox_rows(2000);
ROLLBACK;
