"""The outbox row's task id as a typed column, for the relay's per-task order.

The relay's claim (audit/relay.py) probes "no older unsent row of the same task" and
partitions the claimed rows by task. It read the task id out of the JSON envelope
(``payload->>'task_id'``, a text expression, indexed by migration 0004). Now
``task_id`` is a ``uuid`` column *generated* from that same envelope field: every
writer (``event_append``, an older app server during a rolling deploy, a raw insert)
gets it without knowing it exists, and it can never disagree with the envelope.
``audit_outbox_task_unsent_idx`` moves to the column, still partial on unsent rows.

Adding a stored generated column rewrites the table under an exclusive lock: the
outbox holds the unsent rows and the sent rows retention has not purged yet
(docs/retention.md), so this is the size of that backlog.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

FORWARD = """
ALTER TABLE audit_outbox ADD COLUMN task_id uuid
    GENERATED ALWAYS AS ((payload->>'task_id')::uuid) STORED;
DROP INDEX audit_outbox_task_unsent_idx;
CREATE INDEX audit_outbox_task_unsent_idx
    ON audit_outbox (tenant_id, task_id, id)
    WHERE state <> 'sent';
"""

REVERSE = """
DROP INDEX audit_outbox_task_unsent_idx;
ALTER TABLE audit_outbox DROP COLUMN task_id;
CREATE INDEX audit_outbox_task_unsent_idx
    ON audit_outbox (tenant_id, (payload->>'task_id'), id)
    WHERE state <> 'sent';
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0015_drop_redundant_indexes")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, REVERSE)],
            state_operations=[
                migrations.AddField(
                    model_name="outbox",
                    name="task_id",
                    field=models.GeneratedField(
                        expression=Cast(KT("payload__task_id"), models.UUIDField()),
                        output_field=models.UUIDField(null=True),
                        db_persist=True,
                    ),
                ),
            ],
        )
    ]
