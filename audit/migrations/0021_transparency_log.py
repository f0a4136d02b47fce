"""The transparency log: leaves and signed tree heads per tenant (issue 19 §2).

``audit_logentry`` holds each event's place in its tenant's RFC 9162 tree and a
copy of its chain hash (the leaf), written by the checkpoint job; ``audit_treehead``
holds the signed C2SP checkpoint notes (docs/audit-integrity.md, "Transparency
log"). Both are append-only like the checkpoints: a trigger refuses UPDATE and
DELETE unless the current user owns the table (the owner's tenant purge), and a
BEFORE TRUNCATE trigger stops the statement that skips row triggers. Both have
forced row-level security with the tenant scope policy, like every tenant table.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

import portal.ids

FORWARD = """
CREATE FUNCTION audit_tlog_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND portal_current_user_owns(TG_RELID) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = TG_TABLE_NAME || '_append_only_trg';
END $$;
CREATE TRIGGER audit_logentry_append_only_trg
    BEFORE UPDATE OR DELETE ON audit_logentry
    FOR EACH ROW EXECUTE FUNCTION audit_tlog_append_only();
CREATE TRIGGER audit_treehead_append_only_trg
    BEFORE UPDATE OR DELETE ON audit_treehead
    FOR EACH ROW EXECUTE FUNCTION audit_tlog_append_only();
CREATE TRIGGER audit_logentry_truncate_trg BEFORE TRUNCATE ON audit_logentry
    FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();
CREATE TRIGGER audit_treehead_truncate_trg BEFORE TRUNCATE ON audit_treehead
    FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();

ALTER TABLE audit_logentry ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_logentry FORCE ROW LEVEL SECURITY;
CREATE POLICY audit_logentry_tenant_scope ON audit_logentry
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
ALTER TABLE audit_treehead ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_treehead FORCE ROW LEVEL SECURITY;
CREATE POLICY audit_treehead_tenant_scope ON audit_treehead
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
"""

REVERSE = """
DROP POLICY audit_treehead_tenant_scope ON audit_treehead;
ALTER TABLE audit_treehead NO FORCE ROW LEVEL SECURITY;
ALTER TABLE audit_treehead DISABLE ROW LEVEL SECURITY;
DROP POLICY audit_logentry_tenant_scope ON audit_logentry;
ALTER TABLE audit_logentry NO FORCE ROW LEVEL SECURITY;
ALTER TABLE audit_logentry DISABLE ROW LEVEL SECURITY;
DROP TRIGGER audit_treehead_truncate_trg ON audit_treehead;
DROP TRIGGER audit_logentry_truncate_trg ON audit_logentry;
DROP TRIGGER audit_treehead_append_only_trg ON audit_treehead;
DROP TRIGGER audit_logentry_append_only_trg ON audit_logentry;
DROP FUNCTION audit_tlog_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0020_desk_event_codes"),
        ("portal", "0009_freeze"),
    ]

    operations = [
        migrations.CreateModel(
            name="LogEntry",
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
                ("position", models.BigIntegerField()),
                ("event_id", models.UUIDField()),
                ("event_hash", models.CharField(max_length=64)),
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
                        fields=("tenant", "position"),
                        name="audit_logentry_position_uniq",
                    ),
                    models.UniqueConstraint(
                        fields=("tenant", "event_id"), name="audit_logentry_event_uniq"
                    ),
                    models.UniqueConstraint(
                        fields=("tenant", "id"), name="audit_logentry_tenant_id_uniq"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("position__gte", 0)),
                        name="audit_logentry_position_check",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="TreeHead",
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
                ("size", models.BigIntegerField()),
                ("root_hash", models.CharField(max_length=64)),
                ("peaks", models.TextField(blank=True)),
                ("note", models.TextField()),
                ("signed_at", models.DateTimeField()),
                ("key_id", models.CharField(max_length=16)),
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
                        fields=("tenant", "size"), name="audit_treehead_size_uniq"
                    ),
                    models.UniqueConstraint(
                        fields=("tenant", "id"), name="audit_treehead_tenant_id_uniq"
                    ),
                ],
            },
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
