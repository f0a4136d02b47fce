"""The witnesses' cosignatures of a purged tenant's tombstone (issue 19).

``tenant_deletion_tombstonestamp``: one row per witness and tombstone, written by
the operator after the purge commits (tenant_deletion/services.py,
``tombstone_witness``). Guarded as the tombstone is (migration 0003): append-only
(``audit_tlog_append_only``), no ``TRUNCATE`` but the owner's, forced row-level
security with the tenant scope; the app role only reads it and the operator only
inserts it (``portal.db_roles``).
"""

from __future__ import annotations

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

import portal.ids

GUARDS = """
ALTER TABLE tenant_deletion_tombstonestamp ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_deletion_tombstonestamp FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_deletion_tombstonestamp_tenant_scope
    ON tenant_deletion_tombstonestamp
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
CREATE TRIGGER tenant_deletion_tombstonestamp_append_only_trg
    BEFORE UPDATE OR DELETE ON tenant_deletion_tombstonestamp
    FOR EACH ROW EXECUTE FUNCTION audit_tlog_append_only();
CREATE TRIGGER tenant_deletion_tombstonestamp_truncate_trg
    BEFORE TRUNCATE ON tenant_deletion_tombstonestamp
    FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();
"""

NO_GUARDS = """
DROP TRIGGER tenant_deletion_tombstonestamp_truncate_trg
    ON tenant_deletion_tombstonestamp;
DROP TRIGGER tenant_deletion_tombstonestamp_append_only_trg
    ON tenant_deletion_tombstonestamp;
DROP POLICY tenant_deletion_tombstonestamp_tenant_scope
    ON tenant_deletion_tombstonestamp;
ALTER TABLE tenant_deletion_tombstonestamp NO FORCE ROW LEVEL SECURITY;
ALTER TABLE tenant_deletion_tombstonestamp DISABLE ROW LEVEL SECURITY;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("tenant_deletion", "0003_tombstone"),
    ]

    operations = [
        migrations.CreateModel(
            name="TombstoneStamp",
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
                    "tombstone",
                    models.ForeignKey(
                        db_column="tenant_id",
                        on_delete=django.db.models.deletion.PROTECT,
                        to="tenant_deletion.tombstone",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tombstone", "signer"),
                        name="tenant_deletion_tombstonestamp_uniq",
                    )
                ],
            },
        ),
        migrations.RunSQL(GUARDS, NO_GUARDS),
    ]
