"""The append moves its chain's head row itself, in its own statement.

Before (migration 0014), an append took three steps on the head row: the PL/pgSQL
function ``audit_event_chain_head`` locked it (``SELECT … FOR UPDATE``, one WAL
record of its own) and read it, the event was inserted, and the row trigger
``audit_event_chainhead_trg`` moved it forward (``INSERT … ON CONFLICT DO UPDATE``).
On one connection the function took about 120 µs and the trigger about 50 µs of a
480 µs event-and-outbox statement (``EXPLAIN ANALYZE``, docs/audit-integrity.md).

Now ``event_append``'s statement (audit/services.py) begins with an ``UPDATE`` of
the head row that computes the new link — ``head_seq + 1``, the hash over the old
``head_hash`` — and returns it; the event is inserted from what it returns. The
update's row lock serializes appends to one chain as the function's lock did: in
READ COMMITTED a second appender waits for the first to commit and then re-evaluates
its update on the row the first left (PostgreSQL's EvalPlanQual), so it links to the
first's event. ``prev_hash`` keeps the hash the update replaced, because
PostgreSQL 15's ``RETURNING`` sees only the new row. A chain without a row yet
(its first event) gets it from the same statement's ``INSERT … ON CONFLICT DO
NOTHING``; when a concurrent first append wins that race the statement writes
nothing, and ``event_append`` runs it again, which then finds the row.

The head row is written once per event, so its pages keep room for the new
versions (``fillfactor`` 50): an update that finds room on its page is HOT and adds
no entries to the row's two unique indexes. At the default 100, 43 % of the head
updates in a ``bench/run.py`` transition run were HOT.

The chain's unique index now leads with the task: ``(task_id, tenant_id)``, nulls
not distinct. Leading with ``tenant_id`` it tied, in the planner's prices, with
``(tenant_id, id)``: both carry row-level security's ``tenant_id = ANY(scope)``,
which the planner prices the same on each, so on a table without statistics it
chose ``(tenant_id, id)`` and filtered every head row of the tenant (12,039 per
append in a ``bench/peers.py`` run, 1.8 ms instead of 0.4). Led by the task, the
lookup is two equalities on a unique index and the scope a filter on its one row.

The trigger and the function go: nothing else writes events. A hand-written event
(a test, a repair) must now move the head row itself, as
``tests/support/audit_events.py`` does; a head row left behind makes the next append
collide with the partition's unique ``chain_seq`` index or link to the wrong hash,
which ``verify_audit`` reports.
"""

from __future__ import annotations

import importlib

from django.db import migrations, models

FORWARD = """
ALTER TABLE audit_chainhead SET (fillfactor = 50);
DROP TRIGGER audit_event_chainhead_trg ON audit_event;
DROP FUNCTION audit_event_chainhead_advance();
DROP FUNCTION audit_event_chain_head(uuid, uuid);
"""

# Migration 0014's function and trigger, as it wrote them.
_CHAIN_HEAD_0014: str = importlib.import_module(
    "audit.migrations.0014_chain_head"
).FORWARD
REVERSE = (
    "ALTER TABLE audit_chainhead RESET (fillfactor);\n"
    + _CHAIN_HEAD_0014[_CHAIN_HEAD_0014.index("-- The head of one chain") :]
)


class Migration(migrations.Migration):
    dependencies = [("audit", "0016_outbox_task_id")]

    operations = [
        migrations.AddField(
            model_name="chainhead",
            name="prev_hash",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.RemoveConstraint(
            model_name="chainhead", name="audit_chainhead_chain_uniq"
        ),
        migrations.AddConstraint(
            model_name="chainhead",
            constraint=models.UniqueConstraint(
                fields=("task_id", "tenant"),
                name="audit_chainhead_chain_uniq",
                nulls_distinct=False,
            ),
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
