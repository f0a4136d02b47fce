"""The transparency log outlives a purged tenant (issue 19 §2).

``audit_logentry`` and ``audit_treehead`` lose their foreign key to
``portal_tenant``: a tenant deletion under ``purge`` deletes the tenant's events,
checkpoints and the tenant row, but keeps its log's leaves (the event hashes the
proofs need) and signed heads, which end in a signed tombstone
(``tenant_deletion_tombstone``, tenant_deletion migration 0003). Row-level security
by ``tenant_id`` stays as it was; the column keeps its name.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0023_head_stamps"),
        ("portal", "0010_agent_sponsor"),
    ]

    operations = [
        migrations.AlterField(
            model_name="logentry",
            name="tenant",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                to="portal.tenant",
            ),
        ),
        migrations.AlterField(
            model_name="treehead",
            name="tenant",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                to="portal.tenant",
            ),
        ),
    ]
