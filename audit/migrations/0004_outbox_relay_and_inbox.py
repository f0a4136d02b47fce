"""The relay's per-task ordering index, and the consumers' inbox table.

``audit_outbox_task_unsent_idx`` serves the relay's "no older unsent row of the same
task" probe (audit/relay.py): the task id lives only in the payload envelope, so the
index is on the expression ``payload->>'task_id'``, partial on unsent rows.

``audit_inbox`` is the consumer side of at-least-once delivery (audit/inbox.py): one
row per processed message id and consumer. It is not a Django model on purpose: it
belongs to whichever database a consumer uses, and only raw SQL touches it.
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE INDEX audit_outbox_task_unsent_idx
    ON audit_outbox (tenant_id, (payload->>'task_id'), id)
    WHERE state <> 'sent';

CREATE TABLE audit_inbox (
    consumer varchar(100) NOT NULL,
    message_id varchar(200) NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT audit_inbox_consumer_message_pk PRIMARY KEY (consumer, message_id)
);
-- Purging old entries scans by age.
CREATE INDEX audit_inbox_processed_at_idx ON audit_inbox (processed_at);
"""

REVERSE = """
DROP TABLE audit_inbox;
DROP INDEX audit_outbox_task_unsent_idx;
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0004_housekeeping_event_codes")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
