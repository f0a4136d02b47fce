"""Drop three single-column indexes that every append paid for and no query needs.

``audit_event(tenant_id)``, ``audit_outbox(tenant_id)`` and ``audit_outbox(event_id)``
came with Django's foreign keys. Every index of both tables leads with ``tenant_id``,
and the outbox's unique ``(tenant_id, event_id)`` serves the lookups by event (the
retention functions and the composite key's checks name the tenant too).
"""
from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

_INDEXES = {
    "audit_event_tenant_id_00946073": "audit_event (tenant_id)",
    "audit_outbox_tenant_id_390dd116": "audit_outbox (tenant_id)",
    "audit_outbox_event_id_8bf1d36e": "audit_outbox (event_id)",
}


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0014_chain_head"),
        ("portal", "0008_agentkey_expiry"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    sql=[f"DROP INDEX IF EXISTS {name}" for name in _INDEXES],
                    reverse_sql=[
                        f"CREATE INDEX IF NOT EXISTS {name} ON {table}"
                        for name, table in _INDEXES.items()
                    ],
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        to="portal.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="outbox",
                    name="event",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="audit.event",
                    ),
                ),
                migrations.AlterField(
                    model_name="outbox",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        to="portal.tenant",
                    ),
                ),
            ],
        )
    ]
