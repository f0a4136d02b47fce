"""Comments on desk items (issue 24 §2): a tenant's rows, append-only.

Django makes the table; this adds what it cannot say: the comment points at its
task by ``(tenant_id, task_id)`` (invariant 1), the scope policy every tenant-owned
table has (tasks migration 0017), and a trigger that refuses any UPDATE (the app
role holds no UPDATE or DELETE on it either: ``portal.db_roles.APP_GRANTS``; the
operator deletes a deleted tenant's comments, ``OPERATOR_GRANTS``).
"""

from __future__ import annotations

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models

import portal.ids

FORWARD = """
ALTER TABLE console_deskcomment ADD CONSTRAINT console_deskcomment_task_same_tenant_fk
    FOREIGN KEY (tenant_id, task_id) REFERENCES tasks_task (tenant_id, id);
ALTER TABLE console_deskcomment ENABLE ROW LEVEL SECURITY;
ALTER TABLE console_deskcomment FORCE ROW LEVEL SECURITY;
CREATE POLICY console_deskcomment_tenant_scope ON console_deskcomment
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
CREATE FUNCTION console_deskcomment_refuse_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'desk comment %: comments are append-only', OLD.id
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'console_deskcomment_append_only_trg';
END $$;
CREATE TRIGGER console_deskcomment_append_only_trg BEFORE UPDATE ON console_deskcomment
    FOR EACH ROW EXECUTE FUNCTION console_deskcomment_refuse_update();
"""

REVERSE = """
DROP TRIGGER console_deskcomment_append_only_trg ON console_deskcomment;
DROP FUNCTION console_deskcomment_refuse_update();
DROP POLICY console_deskcomment_tenant_scope ON console_deskcomment;
ALTER TABLE console_deskcomment NO FORCE ROW LEVEL SECURITY;
ALTER TABLE console_deskcomment DISABLE ROW LEVEL SECURITY;
ALTER TABLE console_deskcomment DROP CONSTRAINT console_deskcomment_task_same_tenant_fk;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0002_saved_search"),
        ("portal", "0013_auth_failure_window"),
        ("tasks", "0021_approval_quorum"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="DeskComment",
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
                ("body", models.CharField(max_length=2000)),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        editable=False,
                    ),
                ),
                (
                    "author",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "task",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="tasks.task",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="portal.tenant",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["tenant", "task", "created_at"],
                        name="console_deskcomment_task_idx",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "id"),
                        name="console_deskcomment_tenant_id_uniq",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("body__regex", "^\\s*$"), _negated=True),
                        name="console_deskcomment_body_check",
                    ),
                ],
            },
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
