"""Witness cosignatures and RFC 3161 tokens of tree heads (issue 19 §3).

``audit_headstamp`` keeps what vouches for a tree head from outside the portal
(docs/audit-integrity.md, "Witnesses", "Timestamps"). Append-only like the heads
(the same trigger function: only the owner deletes, for the tenant purge), forced
row-level security with the tenant scope, and a composite foreign key to the head
of the same tenant that cascades on the owner's purge of the heads.
"""

from __future__ import annotations

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

import portal.ids

FORWARD = """
ALTER TABLE audit_headstamp ADD CONSTRAINT audit_headstamp_tree_head_fk
    FOREIGN KEY (tenant_id, tree_head_id) REFERENCES audit_treehead (tenant_id, id)
    ON DELETE CASCADE;
CREATE INDEX audit_headstamp_tree_head_idx ON audit_headstamp (tenant_id, tree_head_id);
CREATE TRIGGER audit_headstamp_append_only_trg
    BEFORE UPDATE OR DELETE ON audit_headstamp
    FOR EACH ROW EXECUTE FUNCTION audit_tlog_append_only();
CREATE TRIGGER audit_headstamp_truncate_trg BEFORE TRUNCATE ON audit_headstamp
    FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();
ALTER TABLE audit_headstamp ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_headstamp FORCE ROW LEVEL SECURITY;
CREATE POLICY audit_headstamp_tenant_scope ON audit_headstamp
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
"""

REVERSE = """
DROP POLICY audit_headstamp_tenant_scope ON audit_headstamp;
ALTER TABLE audit_headstamp NO FORCE ROW LEVEL SECURITY;
ALTER TABLE audit_headstamp DISABLE ROW LEVEL SECURITY;
DROP TRIGGER audit_headstamp_truncate_trg ON audit_headstamp;
DROP TRIGGER audit_headstamp_append_only_trg ON audit_headstamp;
DROP INDEX audit_headstamp_tree_head_idx;
ALTER TABLE audit_headstamp DROP CONSTRAINT audit_headstamp_tree_head_fk;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0022_approval_event_codes"),
    ]

    operations = [
        migrations.CreateModel(
            name="HeadStamp",
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
                ("tenant_id", models.UUIDField()),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("cosignature", "Cosignature"),
                            ("rfc3161", "Rfc3161"),
                        ],
                        max_length=16,
                    ),
                ),
                ("signer", models.CharField(max_length=255)),
                ("stamp", models.TextField()),
                ("stamped_at", models.DateTimeField()),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now()
                    ),
                ),
                (
                    "tree_head",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="audit.treehead",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["tenant_id", "kind", "signer"],
                        name="audit_headstamp_signer_idx",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant_id", "tree_head", "kind", "signer"),
                        name="audit_headstamp_uniq",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("kind__in", ["cosignature", "rfc3161"])),
                        name="audit_headstamp_kind_check",
                    ),
                ],
            },
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
