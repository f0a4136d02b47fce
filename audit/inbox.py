"""The consumer side of at-least-once delivery: process each message id once.

The relay publishes every outbox row at least once, so a consumer may see a message
twice (a relay crashed between the broker's confirm and its ``sent`` mark, or the
consumer crashed before its ack). ``inbox_process_once`` records the message id in
``audit_inbox`` (migration 0004) *in the same transaction* as the handler's own
writes: either both commit or neither does. Ack the message only after it returns.

- duplicate delivery after a commit: the insert conflicts, the handler is skipped;
- crash after the handler but before the commit: both roll back, the broker
  redelivers, and the message is processed again, cleanly;
- two consumers racing on one id: the second insert waits for the first transaction,
  then skips (first committed) or proceeds (first rolled back).

The table has no tenant: it belongs to the consumer, keyed by (consumer, message_id).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from django.db import connection, transaction

from portal import db as portal_db

_CLAIM_MESSAGE = """
INSERT INTO audit_inbox (consumer, message_id) VALUES (%s, %s)
ON CONFLICT (consumer, message_id) DO NOTHING
"""

_PURGE = """
DELETE FROM audit_inbox
WHERE consumer = %s AND processed_at < now() - make_interval(secs => %s)
"""


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def inbox_process_once(
    *, consumer: str, message_id: str, handler: Callable[[], None]
) -> bool:
    """Run ``handler`` unless ``consumer`` already processed ``message_id``.

    Guarantee: the inbox row and everything ``handler`` writes through Django's
    default connection commit together, so each message id is processed exactly once
    per consumer however often it is delivered. Returns True when the handler ran,
    False for a duplicate. If the handler raises, nothing is recorded and the error
    propagates: do not ack, so the broker redelivers.

    Raises:
        ValueError: an empty consumer name or message id.
    """
    if not consumer or not message_id:
        raise ValueError("consumer and message_id are required")
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_MESSAGE, [consumer, message_id])
        if cursor.rowcount == 0:
            return False
    handler()
    return True


@transaction.atomic(durable=True)
def inbox_purge(*, consumer: str, older_than: dt.timedelta) -> int:
    """Forget message ids processed longer ago than ``older_than``; how many.

    Guarantee: keep ``older_than`` well above the longest time a message can still
    be redelivered (relay backoff cap times attempts, plus queue retention), or an old
    duplicate would be processed again.
    """
    with connection.cursor() as cursor:
        cursor.execute(_PURGE, [consumer, older_than.total_seconds()])
        return cursor.rowcount
