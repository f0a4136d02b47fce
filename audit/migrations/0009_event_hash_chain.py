"""The event hash chain and signed checkpoints (docs/audit-integrity.md).

Existing events are chained here, in ``(created_at, id)`` order per chain, so a
database from before this migration verifies like a new one. The backfill uses
``audit.chain``'s functions rather than a copy: the hash format is versioned and
frozen there, and two copies that drift would make old rows fail verification.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

import portal.ids
from audit import chain

_CHAIN_HEAD = """
-- The head of one chain, read after taking the chain's advisory lock. VOLATILE: in
-- READ COMMITTED its query takes a fresh snapshot, so it sees an append that
-- committed while this transaction waited for the lock (see event_append).
CREATE FUNCTION audit_event_chain_head(
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

CREATE FUNCTION audit_checkpoint_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('portal.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit checkpoints are append-only (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'audit_checkpoint_append_only_trg';
END $$;
CREATE TRIGGER audit_checkpoint_append_only_trg
    BEFORE UPDATE OR DELETE ON audit_checkpoint
    FOR EACH ROW EXECUTE FUNCTION audit_checkpoint_append_only();
"""

_CHAIN_HEAD_REVERSE = """
DROP TRIGGER audit_checkpoint_append_only_trg ON audit_checkpoint;
DROP FUNCTION audit_checkpoint_append_only();
DROP FUNCTION audit_event_chain_head(uuid, uuid);
"""

_OLD_EVENTS = f"""
SELECT id, tenant_id, task_id, operation_id, code, actor_type, actor_id, reason_code,
    contract_key, contract_version, payload::text, trace_id, span_id,
    {chain.CREATED_AT_SQL.format(column="created_at")}
FROM audit_event WHERE chain_seq IS NULL
ORDER BY tenant_id, task_id NULLS FIRST, created_at, id
"""


def chain_existing_events(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Link every event written before the chain existed, oldest first per chain."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(_OLD_EVENTS)
        rows = cursor.fetchall()
        if not rows:
            return
        links = []
        last_chain, seq, prev = None, 0, None
        for row in rows:
            (event_id, tenant_id, task_id, operation_id, code, actor_type, actor_id,
             reason_code, contract_key, contract_version, payload_text, trace_id,
             span_id, created_at) = row  # fmt: skip
            if (tenant_id, task_id) != last_chain:
                last_chain, seq, prev = (tenant_id, task_id), 0, None
            content = chain.event_content(
                event_id=event_id, tenant_id=tenant_id, task_id=task_id,
                operation_id=operation_id, code=code, actor_type=actor_type,
                actor_id=actor_id, reason_code=reason_code, contract_key=contract_key,
                contract_version=contract_version,
                payload=chain.stored_payload(payload_text), trace_id=trace_id,
                span_id=span_id, created_at=created_at,
            )  # fmt: skip
            seq += 1
            digest = chain.event_hash(prev_hash=prev, content=content)
            links.append((seq, prev, digest, event_id))
            prev = digest
        cursor.execute(
            "ALTER TABLE audit_event DISABLE TRIGGER audit_event_append_only_trg"
        )
        cursor.executemany(
            "UPDATE audit_event SET chain_seq = %s, prev_hash = %s, hash = %s"
            " WHERE id = %s",
            links,
        )
        cursor.execute(
            "ALTER TABLE audit_event ENABLE TRIGGER audit_event_append_only_trg"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0008_outbox_monitor_idx"),
        ("portal", "0006_membership_permissions"),
    ]

    operations = [
        migrations.CreateModel(
            name="Checkpoint",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=portal.ids.new_id,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("task_id", models.UUIDField(blank=True, null=True)),
                ("head_seq", models.BigIntegerField()),
                ("head_event_id", models.UUIDField()),
                ("head_hash", models.CharField(max_length=64)),
                ("event_count", models.BigIntegerField()),
                ("signed_at", models.DateTimeField()),
                ("key_id", models.CharField(max_length=16)),
                ("signature", models.CharField(max_length=128)),
            ],
        ),
        migrations.AddField(
            model_name="event",
            name="chain_seq",
            field=models.BigIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="event",
            name="hash",
            field=models.CharField(
                blank=True, editable=False, max_length=64, null=True
            ),
        ),
        migrations.AddField(
            model_name="event",
            name="prev_hash",
            field=models.CharField(
                blank=True, editable=False, max_length=64, null=True
            ),
        ),
        migrations.AddConstraint(
            model_name="event",
            constraint=models.UniqueConstraint(
                condition=models.Q(("task_id__isnull", False)),
                fields=("tenant", "task_id", "chain_seq"),
                name="audit_event_task_chain_uniq",
            ),
        ),
        migrations.AddConstraint(
            model_name="event",
            constraint=models.UniqueConstraint(
                condition=models.Q(("task_id__isnull", True)),
                fields=("tenant", "chain_seq"),
                name="audit_event_tenant_chain_uniq",
            ),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="tenant",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, to="portal.tenant"
            ),
        ),
        migrations.AddIndex(
            model_name="checkpoint",
            index=models.Index(
                fields=["tenant", "task_id", "signed_at"],
                name="audit_checkpoint_chain_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="checkpoint",
            index=models.Index(
                fields=["tenant", "signed_at"], name="audit_checkpoint_signed_idx"
            ),
        ),
        migrations.AddConstraint(
            model_name="checkpoint",
            constraint=models.UniqueConstraint(
                fields=("tenant", "id"), name="audit_checkpoint_tenant_id_uniq"
            ),
        ),
        migrations.RunPython(chain_existing_events, migrations.RunPython.noop),
        migrations.RunSQL(_CHAIN_HEAD, _CHAIN_HEAD_REVERSE),
    ]
