"""Events become range-partitioned by month on their UUIDv7 id (docs/retention.md).

The partition key is ``id``: event ids are UUIDv7, whose first 48 bits are the Unix
time in milliseconds, so a month is the id range between two UUIDv7 floors. The
primary key ``(id)`` and ``UNIQUE (tenant_id, id)`` contain the key and stay as they
are; the composite foreign key from the outbox still points at them.

No rewrite of the existing table: it becomes the partition ``audit_event_legacy``,
attached with a validated CHECK that proves its range, so ATTACH skips its scan and
every existing index is adopted by the parent's index of the same shape. The CHECKs
are added NOT VALID and validated in their own statements (a SHARE UPDATE EXCLUSIVE
scan, writes go on); only the swap itself (rename, create, attach) holds an
exclusive lock, and it does no scan. Hence ``atomic = False``.

The chain's unique indexes (``tenant_id, task_id, chain_seq``) cannot be unique
across partitions (the key is not in them): each partition has its own, and across
partitions the chain's advisory lock in ``audit_event_chain_head`` orders appends
(tests/concurrency/test_chain_partitions.py proves no fork with real connections).
"""

from __future__ import annotations

from django.db import migrations

# How far an event's id time may be from its created_at (see audit/partitions.py).
ID_TIME_TOLERANCE = "1 day"  # copy of audit.selectors.ID_TIME_TOLERANCE (R7)
# The legacy partition takes ids up to the migration time plus this margin, so rows
# whose ids were minted just before the swap still find their partition.
LEGACY_MARGIN = "1 day"

FUNCTIONS = """
CREATE FUNCTION audit_uuid7_floor(p_at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT (lpad(to_hex(floor(extract(epoch FROM p_at) * 1000)::bigint), 12, '0')
        || '00000000000000000000')::uuid
$$;
COMMENT ON FUNCTION audit_uuid7_floor(timestamptz) IS
    'The smallest UUIDv7 of the millisecond of p_at: partition bounds of audit_event.';

-- A new UUIDv7 of the time p_at, for hand-written SQL that inserts events (tests,
-- loaders): gen_random_uuid() ids belong to no month partition.
CREATE FUNCTION audit_uuid7_at(p_at timestamptz) RETURNS uuid
LANGUAGE sql VOLATILE STRICT AS $$
SELECT (lpad(to_hex(floor(extract(epoch FROM p_at) * 1000)::bigint), 12, '0')
        || '7' || substr(md5(random()::text), 1, 3)
        || '8' || substr(md5(random()::text), 1, 15))::uuid
$$;

CREATE FUNCTION audit_uuid7_time(p_id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT to_timestamp(
    ('x' || lpad(substr(replace(p_id::text, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint
    / 1000.0)
$$;

-- The partitions of audit_event with their id bounds (NULL: unbounded).
CREATE FUNCTION audit_event_partitions(
    OUT name text, OUT lower_id uuid, OUT upper_id uuid
) RETURNS SETOF record LANGUAGE sql STABLE AS $$
SELECT c.relname::text,
    (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                  'FROM \\(''([0-9a-f-]+)''\\)'))[1]::uuid,
    (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                  'TO \\(''([0-9a-f-]+)''\\)'))[1]::uuid
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'audit_event'::regclass
ORDER BY 2 NULLS FIRST
$$;

-- Create the partition of one month (UTC), unless a partition already covers it;
-- starts where an earlier partition (the legacy one) ends. Owner-only work (DDL):
-- SECURITY DEFINER so the app role's beat job can call it and do nothing else.
CREATE FUNCTION audit_event_partition_create(p_month date) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_start timestamp := date_trunc('month', p_month::timestamp);
    v_from uuid := audit_uuid7_floor(v_start AT TIME ZONE 'UTC');
    v_to uuid := audit_uuid7_floor((v_start + interval '1 month') AT TIME ZONE 'UTC');
    v_name text := 'audit_event_p' || to_char(v_start, 'YYYYMM');
    v_covered uuid;
    v_trigger record;
    v_parent record;
BEGIN
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    -- One creator at a time; the next one sees the partition.
    PERFORM pg_advisory_xact_lock(hashtextextended('audit.partition_create', 0));
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT p.upper_id INTO v_covered FROM audit_event_partitions() p
    WHERE (p.lower_id IS NULL OR p.lower_id < v_to) AND p.upper_id > v_from
    ORDER BY p.upper_id DESC LIMIT 1;
    IF v_covered IS NOT NULL THEN
        IF v_covered >= v_to THEN
            RETURN NULL;  -- an earlier partition covers the whole month
        END IF;
        v_from := v_covered;
    END IF;
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF audit_event FOR VALUES FROM (%L) TO (%L)',
        v_name, v_from, v_to);
    -- A chain is a line inside each partition (see the migration's docstring).
    EXECUTE format(
        'CREATE UNIQUE INDEX %I ON %I (tenant_id, task_id, chain_seq) '
        'WHERE task_id IS NOT NULL', v_name || '_task_chain_uniq', v_name);
    EXECUTE format(
        'CREATE UNIQUE INDEX %I ON %I (tenant_id, chain_seq) WHERE task_id IS NULL',
        v_name || '_tenant_chain_uniq', v_name);
    -- Row-level security and statement triggers are not inherited: copy them.
    SELECT relrowsecurity, relforcerowsecurity INTO v_parent FROM pg_class
    WHERE oid = 'audit_event'::regclass;
    IF v_parent.relrowsecurity THEN
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', v_name);
    END IF;
    IF v_parent.relforcerowsecurity THEN
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', v_name);
    END IF;
    FOR v_trigger IN
        SELECT t.tgname, t.tgfoid::regproc AS func, t.tgenabled FROM pg_trigger t
        WHERE t.tgrelid = 'audit_event'::regclass AND NOT t.tgisinternal
          AND (t.tgtype & 1) = 0 AND (t.tgtype & 32) <> 0  -- statement, TRUNCATE
    LOOP
        EXECUTE format(
            'CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
            'EXECUTE FUNCTION %s()', v_trigger.tgname, v_name, v_trigger.func);
        IF v_trigger.tgenabled = 'A' THEN
            EXECUTE format('ALTER TABLE %I ENABLE ALWAYS TRIGGER %I',
                           v_name, v_trigger.tgname);
        END IF;
    END LOOP;
    RETURN v_name;
END $$;
REVOKE ALL ON FUNCTION audit_event_partition_create(date) FROM PUBLIC;

-- Every month from the current one to p_months_ahead months ahead.
CREATE FUNCTION audit_event_partitions_ensure(p_months_ahead integer)
RETURNS SETOF text LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp AS $$
DECLARE
    v_month date;
    v_made text;
BEGIN
    IF p_months_ahead < 0 OR p_months_ahead > 24 THEN
        RAISE EXCEPTION 'months ahead must be 0..24, not %', p_months_ahead;
    END IF;
    FOR v_month IN
        SELECT (date_trunc('month', now() AT TIME ZONE 'UTC')
                + make_interval(months => m))::date
        FROM generate_series(0, p_months_ahead) m
    LOOP
        v_made := audit_event_partition_create(v_month);
        IF v_made IS NOT NULL THEN
            RETURN NEXT v_made;
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION audit_event_partitions_ensure(integer) FROM PUBLIC;
"""

FUNCTIONS_REVERSE = """
DROP FUNCTION audit_event_partitions_ensure(integer);
DROP FUNCTION audit_event_partition_create(date);
DROP FUNCTION audit_event_partitions();
DROP FUNCTION audit_uuid7_time(uuid);
DROP FUNCTION audit_uuid7_at(timestamptz);
DROP FUNCTION audit_uuid7_floor(timestamptz);
"""

# Step 1 (no exclusive lock held across a scan): the CHECKs the legacy partition
# needs, NOT VALID, then validated in their own statements.
LEGACY_RANGE = f"""
DO $$
DECLARE
    v_bound uuid := audit_uuid7_floor(
        greatest(now(), (SELECT audit_uuid7_time(id) FROM audit_event ORDER BY id DESC LIMIT 1))
        + interval '{LEGACY_MARGIN}');
BEGIN
    EXECUTE format(
        'ALTER TABLE audit_event ADD CONSTRAINT audit_event_legacy_range_check '
        'CHECK (id < %L::uuid) NOT VALID', v_bound);
END $$;
"""
ID_TIME_CHECK = f"""
ALTER TABLE audit_event ADD CONSTRAINT audit_event_id_time_check CHECK (
    created_at > audit_uuid7_time(id) - interval '{ID_TIME_TOLERANCE}'
    AND created_at < audit_uuid7_time(id) + interval '{ID_TIME_TOLERANCE}'
) NOT VALID;
"""

# Step 2: the swap, one transaction, no scan.
SWAP = """
BEGIN;
LOCK TABLE audit_event IN ACCESS EXCLUSIVE MODE;
DO $$
DECLARE
    v_index record;
    v_bound text;
    v_fk record;
BEGIN
    ALTER TABLE audit_event RENAME TO audit_event_legacy;
    FOR v_index IN
        SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'audit_event_legacy'::regclass
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', v_index.relname,
            left(replace(v_index.relname, 'audit_event_', 'audit_event_legacy_'), 63));
    END LOOP;
    -- The parent: same columns, defaults and CHECKs (the range CHECK is the
    -- legacy partition's own).
    CREATE TABLE audit_event (
        LIKE audit_event_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS
    ) PARTITION BY RANGE (id);
    ALTER TABLE audit_event DROP CONSTRAINT audit_event_legacy_range_check;
    ALTER TABLE audit_event ADD CONSTRAINT audit_event_pkey PRIMARY KEY (id);
    ALTER TABLE audit_event ADD CONSTRAINT audit_event_tenant_id_uniq
        UNIQUE (tenant_id, id);
    FOR v_fk IN
        SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
        WHERE conrelid = 'audit_event_legacy'::regclass AND contype = 'f'
    LOOP
        EXECUTE format('ALTER TABLE audit_event ADD CONSTRAINT %I %s',
                       v_fk.conname, v_fk.def);
    END LOOP;
    -- The same indexes as the model's, each adopting the legacy table's twin.
    FOR v_index IN
        SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'audit_event_legacy'::regclass AND NOT i.indisunique
    LOOP
        EXECUTE replace(replace(v_index.def, v_index.relname,
                        replace(v_index.relname, 'audit_event_legacy_', 'audit_event_')),
                        'ON public.audit_event_legacy ', 'ON public.audit_event ');
    END LOOP;
    -- Row triggers are cloned onto every partition from the parent.
    DROP TRIGGER audit_event_append_only_trg ON audit_event_legacy;
    CREATE TRIGGER audit_event_append_only_trg BEFORE UPDATE OR DELETE ON audit_event
        FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
    -- Statement triggers are not: the parent gets its own TRUNCATE guard (audit
    -- migration 0010), the legacy partition keeps the one it had, and
    -- audit_event_partition_create copies it onto every new partition.
    CREATE TRIGGER audit_event_truncate_trg BEFORE TRUNCATE ON audit_event
        FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();
    SELECT (regexp_match(pg_get_constraintdef(oid), '''([0-9a-f-]+)'''))[1]
    INTO v_bound FROM pg_constraint
    WHERE conrelid = 'audit_event_legacy'::regclass
      AND conname = 'audit_event_legacy_range_check';
    EXECUTE format(
        'ALTER TABLE audit_event ATTACH PARTITION audit_event_legacy '
        'FOR VALUES FROM (MINVALUE) TO (%L)', v_bound);
    -- The outbox's composite foreign key now points at the parent.
    ALTER TABLE audit_outbox DROP CONSTRAINT audit_outbox_event_same_tenant_fk;
    ALTER TABLE audit_outbox ADD CONSTRAINT audit_outbox_event_same_tenant_fk
        FOREIGN KEY (tenant_id, event_id) REFERENCES audit_event (tenant_id, id)
        NOT VALID;
END $$;
SELECT audit_event_partitions_ensure(3);
COMMIT;
"""

SWAP_REVERSE = """
BEGIN;
DO $$
DECLARE
    v_part record;
BEGIN
    ALTER TABLE audit_outbox DROP CONSTRAINT audit_outbox_event_same_tenant_fk;
    FOR v_part IN SELECT name FROM audit_event_partitions() WHERE lower_id IS NOT NULL
    LOOP
        EXECUTE format('INSERT INTO audit_event_legacy SELECT * FROM %I', v_part.name);
    END LOOP;
    ALTER TABLE audit_event DETACH PARTITION audit_event_legacy;
    DROP TABLE audit_event;
    ALTER TABLE audit_event_legacy RENAME TO audit_event;
    ALTER TABLE audit_event DROP CONSTRAINT audit_event_legacy_range_check;
    ALTER TABLE audit_event DROP CONSTRAINT audit_event_id_time_check;
    FOR v_part IN
        SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'audit_event'::regclass
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', v_part.relname,
            replace(v_part.relname, 'audit_event_legacy_', 'audit_event_'));
    END LOOP;
    CREATE TRIGGER audit_event_append_only_trg BEFORE UPDATE OR DELETE ON audit_event
        FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
    ALTER TABLE audit_outbox ADD CONSTRAINT audit_outbox_event_same_tenant_fk
        FOREIGN KEY (tenant_id, event_id) REFERENCES audit_event (tenant_id, id);
END $$;
COMMIT;
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("audit", "0010_owner_only_purge")]

    operations = [
        migrations.RunSQL(FUNCTIONS, FUNCTIONS_REVERSE),
        migrations.RunSQL(LEGACY_RANGE, migrations.RunSQL.noop),
        migrations.RunSQL(
            "ALTER TABLE audit_event VALIDATE CONSTRAINT audit_event_legacy_range_check",
            migrations.RunSQL.noop,
        ),
        migrations.RunSQL(ID_TIME_CHECK, migrations.RunSQL.noop),
        migrations.RunSQL(
            "ALTER TABLE audit_event VALIDATE CONSTRAINT audit_event_id_time_check",
            migrations.RunSQL.noop,
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(SWAP, SWAP_REVERSE)],
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="event", name="audit_event_task_chain_uniq"
                ),
                migrations.RemoveConstraint(
                    model_name="event", name="audit_event_tenant_chain_uniq"
                ),
            ],
        ),
        migrations.RunSQL(
            "ALTER TABLE audit_outbox VALIDATE CONSTRAINT "
            "audit_outbox_event_same_tenant_fk",
            migrations.RunSQL.noop,
        ),
    ]
