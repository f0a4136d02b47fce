"""A head row per chain, so an append no longer searches every month partition.

Before, ``audit_event_chain_head`` took the chain's advisory lock and read the head
from ``audit_event`` by ``(tenant_id, task_id)``: a probe of every month partition's
chain index, 16 µs on one table and 200–325 µs with 27 partitions
(docs/retention.md). Now it locks and reads the chain's row of ``audit_chainhead``
(one index lookup), and ``audit_event_chainhead_trg`` moves that row forward on
every chained insert, in the inserting transaction. The function keeps its name and
result, so ``event_append``'s statement is unchanged.

- The row lock (``FOR UPDATE``) takes the advisory lock's place: appends to one
  chain wait for each other until commit; in READ COMMITTED the waiter then reads
  the row as the first transaction left it. A new chain's row is made at 0 by its
  first append (``ON CONFLICT DO NOTHING`` waits for a concurrent maker).
- The trigger moves the row only forward (the highest ``chain_seq``), which is what
  the old query returned; so rows written by hand (tests, repairs) keep it right
  too. A retention purge leaves the row alone: a chain whose events all went
  continues from the last one, as it did from its anchor.
- ``audit_chainhead`` is tenant-owned: forced row-level security with the scope
  policy (tasks migration 0012). An append runs in its tenant's scope, as the
  event's own row must (tasks migration 0017); outside it the head row is out of
  sight and making one is refused, so the append fails.
- Existing chains get their row here, from their newest event or, for a chain
  retention emptied, its newest anchor; ``audit_event`` is locked against appends
  (SHARE) meanwhile.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

FORWARD = """
LOCK TABLE audit_event IN SHARE MODE;
INSERT INTO audit_chainhead (tenant_id, task_id, head_seq, head_event_id, head_hash)
SELECT DISTINCT ON (h.tenant_id, h.task_id)
    h.tenant_id, h.task_id, h.seq, h.event_id, h.hash
FROM (
    SELECT e.tenant_id, e.task_id, e.chain_seq AS seq, e.id AS event_id, e.hash
    FROM audit_event e WHERE e.chain_seq IS NOT NULL
    UNION ALL
    SELECT a.tenant_id, a.task_id, a.seq, a.event_id, a.hash
    FROM audit_retentionanchor a
) h
ORDER BY h.tenant_id, h.task_id, h.seq DESC;

ALTER TABLE audit_chainhead ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_chainhead FORCE ROW LEVEL SECURITY;
CREATE POLICY audit_chainhead_tenant_scope ON audit_chainhead
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));

-- The head of one chain, its row locked until commit. VOLATILE: in READ COMMITTED
-- each of its statements sees what committed before it (see event_append).
CREATE OR REPLACE FUNCTION audit_event_chain_head(
    p_tenant uuid, p_task uuid, OUT head_seq bigint, OUT head_hash text
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    LOOP
        -- Two statements, not "IS NOT DISTINCT FROM": each uses the chain index.
        IF p_task IS NULL THEN
            SELECT h.head_seq, h.head_hash INTO head_seq, head_hash
            FROM audit_chainhead h
            WHERE h.tenant_id = p_tenant AND h.task_id IS NULL FOR UPDATE;
        ELSE
            SELECT h.head_seq, h.head_hash INTO head_seq, head_hash
            FROM audit_chainhead h
            WHERE h.tenant_id = p_tenant AND h.task_id = p_task FOR UPDATE;
        END IF;
        EXIT WHEN FOUND;
        -- A new chain: make its row. A concurrent maker's insert is waited for;
        -- when it won, the next turn locks its row.
        INSERT INTO audit_chainhead AS h (tenant_id, task_id, head_seq)
        VALUES (p_tenant, p_task, 0)
        ON CONFLICT (tenant_id, task_id) DO NOTHING
        RETURNING h.head_seq, h.head_hash INTO head_seq, head_hash;
        EXIT WHEN FOUND;
    END LOOP;
    IF head_seq = 0 THEN
        head_seq := NULL;  -- no event yet: the first one is #1, after GENESIS
    END IF;
END $$;

-- Every chained insert moves its chain's row forward (never back).
CREATE FUNCTION audit_event_chainhead_advance() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.chain_seq IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO audit_chainhead AS h (
        tenant_id, task_id, head_seq, head_event_id, head_hash
    ) VALUES (NEW.tenant_id, NEW.task_id, NEW.chain_seq, NEW.id, NEW.hash)
    ON CONFLICT (tenant_id, task_id) DO UPDATE
        SET head_seq = EXCLUDED.head_seq,
            head_event_id = EXCLUDED.head_event_id,
            head_hash = EXCLUDED.head_hash
        WHERE h.head_seq < EXCLUDED.head_seq;
    RETURN NULL;
END $$;
CREATE TRIGGER audit_event_chainhead_trg
    AFTER INSERT ON audit_event
    FOR EACH ROW EXECUTE FUNCTION audit_event_chainhead_advance();
"""

# Migration 0013's function: the advisory lock, then the newest event or anchor.
REVERSE = """
DROP TRIGGER audit_event_chainhead_trg ON audit_event;
DROP FUNCTION audit_event_chainhead_advance();
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
"""


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0013_retention_functions"),
        ("portal", "0008_agentkey_expiry"),
        # portal_tenant_scope(), the scope policies' function
        ("tasks", "0012_row_level_security"),
    ]

    operations = [
        migrations.CreateModel(
            name="ChainHead",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task_id", models.UUIDField(blank=True, null=True)),
                ("head_seq", models.BigIntegerField()),
                ("head_event_id", models.UUIDField(blank=True, null=True)),
                ("head_hash", models.CharField(blank=True, max_length=64, null=True)),
                (
                    "tenant",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        to="portal.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "task_id"),
                        name="audit_chainhead_chain_uniq",
                        nulls_distinct=False,
                    ),
                    models.UniqueConstraint(
                        fields=("tenant", "id"), name="audit_chainhead_tenant_id_uniq"
                    ),
                ],
            },
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
