"""The outbox relay: claim due rows, publish them with confirms, record each outcome.

docs/style.md R9, and docs/outbox.md for the operator's view. One relay pass:

1. **Claim** (one statement, its own transaction): lock due ``pending`` rows with
   ``FOR UPDATE SKIP LOCKED``, lease them by setting ``leased_until`` to
   ``PORTAL_OUTBOX_CLAIM_LEASE_S`` ahead and count the attempt, commit. Other relays
   skip locked rows and ignore leased ones, so in the normal path no two relays ever
   hold the same row. ``leased_until`` is in no index, so this update is HOT when the
   page has room (migration 0029: ``fillfactor = 45``); the ``sent`` mark, which
   changes ``state``, is the one update per row that writes index entries.
2. **Publish in waves** with no transaction open. Wave *k* holds the *k*-th claimed
   row of every task (the first wave also holds the rows without a task). A wave is
   published whole on one channel in publisher-confirm mode, then the relay waits
   for all its confirms (``basic.ack``/``basic.nack`` by delivery tag) before the
   next wave goes out.
3. **Record** each wave's outcome: its confirmed rows become ``sent`` in one
   set-based statement, sent once the next wave is written (the database marks while
   the broker persists that wave); every other row gets a capped doubling backoff,
   or ``dead`` after ``PORTAL_OUTBOX_MAX_ATTEMPTS``, and its task's later rows in the
   batch are released (their attempt not counted).

Per-task order. A row is claimable only when no *older* unsent (pending or dead) row
of the same task exists (a ``dismissed`` row, given up by an operator, does not
count); the task id is the envelope's, typed (``task_id``, a column generated from
``payload->>'task_id'`` by migration 0016 and indexed on unsent rows). The claim
takes the oldest due row of each task (its "head", locked with ``SKIP LOCKED``) plus
the contiguous due rows behind it, and the relay publishes them in id order, one per
wave: each goes out only after the previous one's confirm. A task is therefore in
the hands of one relay at a time, and its next row is claimable only once this one
is ``sent``: messages of one task reach the broker in id order. Ids
are generated inside the writing transaction, so a write that commits before another
begins has the lower id: publish order follows commit order wherever there is one
(overlapping writes have none; docs/outbox.md has the limits). Rows without a task
have no order among themselves. A dead row holds its task's later rows back until an
operator retries it (strict order beats availability for one task; other tasks are
unaffected).

At least once. A crash between a wave's confirms and its ``sent`` mark leaves the
wave's confirmed rows leased (and the next wave's, written by then); when the lease
lapses another relay publishes them again, each task's in id order. The claim and
the ``sent`` marks commit asynchronously (``synchronous_commit = off`` for their
transactions only): visible to every other session at once, durable a moment later.
A database crash can lose the last of them; then those rows are pending again and go
out again, in order (the WAL keeps commit order), which is the same duplicate as a
relay crash. Nothing is lost: the rows themselves were written by synchronous
commits. The event id goes out as the AMQP ``message_id``: consumers dedupe on it
(audit/inbox.py).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Protocol

from django.conf import settings
from django.db import connection, transaction

from portal import db as portal_db
from portal import jobs as portal_jobs
from portal import scope
from portal.models import Tenant

from .exceptions import PublishFailed
from .redaction import redact

logger = logging.getLogger(__name__)

RELAY_JOB_NAME: Final = "audit.jobs.relay_outbox_job"
# A nudge older than this is dropped by the worker: beat has run the relay by then.
NUDGE_EXPIRES_S: Final = 30.0
# After a failed nudge, this process sends none for a while (beat covers the gap).
NUDGE_PAUSE_AFTER_FAILURE_S: Final = 5.0
# Named points where tests crash the relay (docs/style.md R18); no-ops otherwise.
# after_claim: once per batch; after_publish, after_record: once per wave.
FAULT_POINTS: Final = ("after_claim", "after_publish", "after_record")

TestHook = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class ClaimedMessage:
    """One leased outbox row, as the relay publishes it."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    topic: str
    key: str  # the event id: the AMQP message_id consumers dedupe on
    body: str  # the JSON envelope, exactly as stored
    task_id: str | None  # the envelope's (column task_id): ordering key, with tenant
    trace_id: str  # from the envelope; "" when the event had no trace
    attempts: int  # including this one
    created_at: dt.datetime


@dataclass(kw_only=True)
class RelayReport:
    """What one relay pass (or several, added up) did."""

    claimed: int = 0
    sent: int = 0
    failed: int = 0  # includes the rows that went dead
    dead: int = 0
    released: int = 0  # claimed but not attempted; back in line, attempt not counted
    broker_down: bool = False

    def __add__(self, other: RelayReport) -> RelayReport:
        counts = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name != "broker_down"
        }
        return RelayReport(**counts, broker_down=self.broker_down or other.broker_down)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class Publisher(Protocol):
    def publish_wave(
        self,
        messages: Sequence[ClaimedMessage],
        *,
        meanwhile: Callable[[], None] | None = None,
    ) -> list[PublishFailed | None]:
        """Publish the messages in order and wait for the broker's confirms.

        Returns one outcome per message, in order: ``None`` once the broker confirmed
        it, otherwise the ``PublishFailed`` that says why not (refused, timed out, or
        the link failed: ``connection_lost``). Never raises for a message's failure.
        ``meanwhile`` runs at most once, after the messages were written and before
        their confirms are awaited (the relay marks the previous wave ``sent``
        there); an error it raises is raised, not turned into outcomes.
        """
        ...


# --- Claim and record ----------------------------------------------------------------

# Heads: the oldest unsent row of each task, when due, locked with SKIP LOCKED.
# "Unsent" is pending or dead: a dismissed row (an operator gave up on it) is never
# claimed and holds nothing back. ``<> 'sent'`` stays spelled out so the partial
# index audit_outbox_task_unsent_idx (WHERE state <> 'sent') still serves the probe.
# ``task_id`` is generated from the envelope (migration 0016). Rows without a task
# (NULL) never match ``=``, so each is a head of its own.
# Followers: the task's next pending rows, as long as each is due (the running
# bool_and stops at the first leased, backing-off or dead row), read per head in id
# order from audit_outbox_task_unsent_idx, at most ``limit`` of them: no more of one
# task can be among the ``limit`` oldest due followers (a task's due followers are
# a prefix of its rows). Joined over the whole table instead, the planner hashed
# every unsent row (a sequential scan of sent rows too) and ran the window over all
# of them: twice the backend CPU of this form on a 2,250-row backlog
# (docs/performance-log.md, 2026-12-05, relay). Due: available_at
# has come and no lease runs (leased_until is in no index, so the lease is a HOT
# update; leased rows stay in audit_outbox_due_idx and the scan steps over them).
# The window and the lock sit in different CTEs because PostgreSQL refuses FOR
# UPDATE beside a window.
_CLAIM = """
WITH heads AS (
    SELECT o.id, o.tenant_id, o.task_id
    FROM audit_outbox AS o
    WHERE o.state = 'pending' AND o.available_at <= app_now()
      AND (o.leased_until IS NULL OR o.leased_until <= app_now())
      AND NOT EXISTS (
          SELECT 1 FROM audit_outbox AS older
          WHERE older.tenant_id = o.tenant_id
            AND older.task_id = o.task_id
            AND older.state <> 'sent' AND older.state <> 'dismissed'
            AND older.id < o.id
      )
    ORDER BY o.available_at, o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
),
followers AS (
    SELECT f.id, f.due_so_far
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT t.id, bool_and(
            t.state = 'pending' AND t.available_at <= app_now()
            AND (t.leased_until IS NULL OR t.leased_until <= app_now())
        ) OVER (ORDER BY t.id) AS due_so_far
        FROM audit_outbox AS t
        WHERE t.tenant_id = h.tenant_id AND t.task_id = h.task_id AND t.id > h.id
          AND t.state <> 'sent' AND t.state <> 'dismissed'
        ORDER BY t.id
        LIMIT %(limit)s
    ) AS f
),
claimable AS (
    SELECT id FROM heads
    UNION ALL
    (SELECT id FROM followers WHERE due_so_far ORDER BY id
     LIMIT %(limit)s - (SELECT count(*) FROM heads))
)
UPDATE audit_outbox AS o
SET attempts = o.attempts + 1,
    leased_until = app_now() + make_interval(secs => %(lease_s)s)
FROM claimable AS c
WHERE o.id = c.id AND o.state = 'pending'
  AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
RETURNING o.id, o.tenant_id, o.topic, o.key, o.payload::text, o.task_id::text,
    COALESCE(o.payload->>'trace_id', ''), o.attempts, o.created_at
"""

# The claim and the sent mark commit without waiting for the WAL flush (see "At
# least once" above): set in the statement, for its transaction only.
_MARK_SENT = """
UPDATE audit_outbox SET state = 'sent', sent_at = app_now(), last_error = ''
WHERE id = ANY(%(ids)s) AND state = 'pending'
  AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
"""

# The capped doubling wait after a failed attempt, for any outbox-shaped table with
# an ``attempts`` column counted at the claim: the first failure waits base, then
# 2x, 4x, ... up to cap; the exponent is bounded so a large attempts count cannot
# overflow. routing.delivery's notifications back off by the same expression.
BACKOFF_UNTIL_SQL: Final = """app_now() + make_interval(secs => LEAST(
    %(cap)s, %(base)s * power(2, LEAST(GREATEST(attempts - 1, 0), 60))
))"""

# A failure ends the lease: the back-off (available_at) alone decides when it is due.
_MARK_FAILED = f"""
UPDATE audit_outbox SET
    state = CASE WHEN attempts >= %(max_attempts)s THEN 'dead' ELSE 'pending' END,
    available_at = {BACKOFF_UNTIL_SQL},
    leased_until = NULL,
    last_error = left(%(error)s, 500)
WHERE id = %(id)s AND state = 'pending'
RETURNING state
"""

# Back in line where it was (its available_at unchanged), due at once: the lease
# ends and the attempt is not counted. Touches no indexed column (HOT).
_RELEASE = """
UPDATE audit_outbox SET attempts = GREATEST(attempts - 1, 0), leased_until = NULL
WHERE id = ANY(%(ids)s) AND state = 'pending'
"""

_RETRY_DEAD = """
UPDATE audit_outbox SET state = 'pending', attempts = 0, available_at = app_now(),
    leased_until = NULL
WHERE tenant_id = %s AND id = ANY(%s) AND state = 'dead'
"""

_RETRY_ALL_DEAD = """
UPDATE audit_outbox SET state = 'pending', attempts = 0, available_at = app_now(),
    leased_until = NULL
WHERE tenant_id = %s AND state = 'dead'
"""

_BACKLOG = """
SELECT
    count(*) FILTER (WHERE state = 'pending'),
    count(*) FILTER (WHERE state = 'pending' AND available_at <= app_now()
        AND (leased_until IS NULL OR leased_until <= app_now())),
    count(*) FILTER (WHERE state = 'dead'),
    EXTRACT(EPOCH FROM app_now() - min(created_at) FILTER (WHERE state = 'pending'))
FROM audit_outbox
WHERE state <> 'sent'
"""


def _statement(sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """One statement as a transaction of its own, sent with the tenant scope in one
    round trip (``scope.one_round_trip``: no ``BEGIN`` and ``COMMIT`` of its own);
    inside a test case's atomic block, the one ``forbid_transaction`` lets through,
    a statement of that block."""
    if connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []
    return scope.one_round_trip(sql, params)


def outbox_claim_batch(*, limit: int | None = None) -> list[ClaimedMessage]:
    """Lease up to ``limit`` due outbox rows to this relay, oldest first.

    Guarantee: one statement, its own transaction. The rows are locked with ``SKIP
    LOCKED`` while it runs and leased for ``PORTAL_OUTBOX_CLAIM_LEASE_S`` after it
    commits, so no other relay claims them until the lease lapses; each row's
    ``attempts`` counts this claim. Per task, only the oldest unsent row and the due
    rows right behind it are claimed (see the module docstring). Returned in id
    order.

    Raises:
        TransactionForbidden: called inside a transaction.
    """
    portal_db.forbid_transaction("the claim commits on its own")
    limit = limit or settings.PORTAL_OUTBOX_BATCH_SIZE
    rows = _statement(
        _CLAIM, {"limit": limit, "lease_s": float(settings.PORTAL_OUTBOX_CLAIM_LEASE_S)}
    )
    messages = [
        ClaimedMessage(
            id=row[0],
            tenant_id=row[1],
            topic=row[2],
            key=row[3],
            body=row[4],
            task_id=row[5],
            trace_id=row[6],
            attempts=row[7],
            created_at=row[8],
        )
        for row in rows
    ]
    return sorted(messages, key=lambda message: message.id)


def _record_sent(messages: Sequence[ClaimedMessage]) -> None:
    """Mark a wave's confirmed rows ``sent``: one statement for all of them."""
    if messages:
        _statement(_MARK_SENT, {"ids": [message.id for message in messages]})


def _record_failure(message: ClaimedMessage, *, error: str) -> bool:
    """Back the row off (or bury it); True when it is now dead."""
    rows = _statement(
        _MARK_FAILED,
        {
            "id": message.id,
            "error": error,
            "max_attempts": settings.PORTAL_OUTBOX_MAX_ATTEMPTS,
            "base": float(settings.PORTAL_OUTBOX_BACKOFF_BASE_S),
            "cap": float(settings.PORTAL_OUTBOX_BACKOFF_CAP_S),
        },
    )
    return bool(rows) and rows[0][0] == "dead"


def _release(ids: Sequence[uuid.UUID]) -> None:
    if ids:
        _statement(_RELEASE, {"ids": list(ids)})


def _no_hook(point: str) -> None:
    pass


class _SentMark:
    """A wave's confirmed rows, marked ``sent`` on the first call and never again:
    while the broker works on the next wave (``Publisher.publish_wave``'s
    ``meanwhile``), or after it if the publisher did not get that far."""

    def __init__(
        self, messages: Sequence[ClaimedMessage], *, then: Callable[[], None]
    ) -> None:
        self._messages: Sequence[ClaimedMessage] | None = messages
        self._then = then

    def __call__(self) -> None:
        messages, self._messages = self._messages, None
        if messages is not None:
            _record_sent(messages)
            self._then()


def _nothing() -> None:
    pass


TaskKey = tuple[uuid.UUID, str]


def _task_of(message: ClaimedMessage) -> TaskKey | None:
    return (message.tenant_id, message.task_id) if message.task_id else None


def _waves(messages: Sequence[ClaimedMessage]) -> list[list[ClaimedMessage]]:
    """Wave k: the k-th row of every task, in id order; rows without a task go in
    the first wave (they have no order among themselves)."""
    waves: list[list[ClaimedMessage]] = []
    seen: dict[TaskKey, int] = {}
    for message in messages:  # in id order
        task = _task_of(message)
        k = 0
        if task is not None:
            k = seen.get(task, 0)
            seen[task] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(message)
    return waves


@scope.in_tenants_with("audit_tenants_with_due_outbox")  # row-level security
def outbox_relay_once(
    *,
    publisher: Publisher,
    limit: int | None = None,
    _test_hook: TestHook | None = None,
) -> RelayReport:
    """Claim one batch, publish it in waves with confirms, and record the outcomes.

    Guarantee: no transaction is open while publishing; a row is marked ``sent`` only
    after the broker confirmed it. Wave k holds the k-th claimed row of each task, so
    a task's row goes out only after its previous row was confirmed: per task order
    holds. Each wave's confirmed rows are marked ``sent`` in one statement, its own
    transaction, sent once the next wave is written, so the database marks while the
    broker persists (the last wave's after its confirms); a crash before a mark
    commits leaves those rows leased, published again when the lease lapses, in
    order. A refused (nack) or unconfirmed row backs off
    (``min(cap, base * 2**(attempts-1))`` seconds) or becomes ``dead`` at
    ``PORTAL_OUTBOX_MAX_ATTEMPTS``; its task's later rows in the batch are released
    (their attempt not counted) so they stay behind it. When the broker link fails,
    the rest of the batch is recorded as failed without another connection attempt:
    one connection attempt per batch. When half the lease is spent before a wave
    goes out, that wave and the rest are released, not published (their lease might
    lapse mid-publish). Safe to run on many workers at once.

    Test hooks (``_test_hook``), once per wave: ``after_claim`` (once per batch),
    ``after_publish`` (the wave's confirms are in and the waves before it are
    recorded; it is not) and ``after_record`` (the wave is recorded; the next wave,
    if any, is written already).

    Raises:
        TransactionForbidden: called inside a transaction.
    """
    portal_db.forbid_transaction("the relay publishes over the network")
    hook = _test_hook or _no_hook
    started = time.monotonic()
    messages = outbox_claim_batch(limit=limit)
    report = RelayReport(claimed=len(messages))
    hook("after_claim")
    publish_until = started + settings.PORTAL_OUTBOX_CLAIM_LEASE_S / 2
    stopped_tasks: set[TaskKey] = set()
    released: list[uuid.UUID] = []
    broken: PublishFailed | None = None
    mark = _SentMark((), then=_nothing)  # the previous wave's, marked at most once
    for wave in _waves(messages):
        going: list[ClaimedMessage] = []
        for message in wave:
            if _task_of(message) in stopped_tasks:
                released.append(message.id)  # its task's earlier row did not go out
            else:
                going.append(message)
        if not going:
            continue
        if broken is None and time.monotonic() > publish_until:
            released.extend(message.id for message in going)
            stopped_tasks.update(filter(None, map(_task_of, going)))
            continue
        outcomes: list[PublishFailed | None]
        published = broken is None
        if not published:
            mark()
            not_sent = PublishFailed(
                f"not published, the broker link failed: {broken}",
                connection_lost=True,
            )
            outcomes = [not_sent] * len(going)
        else:
            outcomes = publisher.publish_wave(going, meanwhile=mark)
            mark()  # unless the publisher ran it (its link failed before the write)
            hook("after_publish")
        pairs = list(zip(going, outcomes, strict=True))
        confirmed = [message for message, failure in pairs if failure is None]
        report.sent += len(confirmed)
        for message, failure in pairs:
            if failure is None:
                continue
            if failure.connection_lost and broken is None:
                broken = failure
                report.broker_down = True
                # Visible in the worker's log (and each row's last_error): a broker
                # down, or blocking publishers (a memory or disk alarm).
                logger.warning("outbox relay: broker link failed, rows back off: %s",
                               failure)  # fmt: skip
            report.failed += 1
            # A broker's error can quote the message it refused: redacted as a payload.
            error = str(redact(str(failure), tenant_id=message.tenant_id))
            if _record_failure(message, error=error):
                report.dead += 1
                logger.error("outbox row %s is dead after %s attempts: %s",
                             message.id, message.attempts, error)  # fmt: skip
            if (task := _task_of(message)) is not None:
                stopped_tasks.add(task)
        recorded = functools.partial(hook, "after_record") if published else _nothing
        mark = _SentMark(confirmed, then=recorded)
    mark()
    _release(released)
    report.released = len(released)
    return report


def outbox_relay_drain(
    *,
    publisher: Publisher,
    limit: int | None = None,
    budget_s: float | None = None,
    _test_hook: TestHook | None = None,
) -> RelayReport:
    """Run relay passes until a batch comes back short, the broker is down, or the
    time budget (``PORTAL_OUTBOX_RELAY_BUDGET_S``) is spent.

    Guarantee: as ``outbox_relay_once``, batch after batch; the report adds them up.

    Raises:
        TransactionForbidden: called inside a transaction.
    """
    limit = limit or settings.PORTAL_OUTBOX_BATCH_SIZE
    budget = settings.PORTAL_OUTBOX_RELAY_BUDGET_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget
    total = RelayReport()
    while True:
        report = outbox_relay_once(
            publisher=publisher, limit=limit, _test_hook=_test_hook
        )
        total += report
        if report.claimed < limit or report.broker_down:
            return total
        if time.monotonic() >= deadline:
            return total


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def outbox_retry_dead(*, tenant: Tenant, ids: Sequence[uuid.UUID] | None = None) -> int:
    """Put the tenant's dead outbox rows (``ids``, or all) back in line.

    Guarantee: only rows of ``tenant`` that are ``dead`` change: to ``pending``, due
    now, with a fresh attempt budget (``attempts`` 0; ``last_error`` is kept for the
    record). The relay is nudged after commit. Idempotent: a row that is not dead is
    left alone. Returns how many rows moved.
    """
    with connection.cursor() as cursor:
        if ids is None:
            cursor.execute(_RETRY_ALL_DEAD, [tenant.pk])
        else:
            cursor.execute(_RETRY_DEAD, [tenant.pk, list(ids)])
        moved = cursor.rowcount
    if moved:
        nudge_relay()
    return moved


@dataclass(frozen=True, kw_only=True)
class OutboxBacklog:
    pending: int
    due: int
    dead: int
    oldest_pending_age_s: float | None


def outbox_backlog() -> OutboxBacklog:
    """Counts over the tenants in scope (row-level security), for monitoring:
    pending, due now, dead."""
    with connection.cursor() as cursor:
        cursor.execute(_BACKLOG)
        pending, due, dead, age = cursor.fetchone()
    return OutboxBacklog(
        pending=pending,
        due=due,
        dead=dead,
        oldest_pending_age_s=None if age is None else float(age),
    )


# --- The nudge -----------------------------------------------------------------------


def nudge_relay() -> None:
    """Ask a worker to run the relay as soon as the current transaction commits.

    Guarantee: never raises; a rollback sends nothing. The outbox row is the record
    of pending work: a lost nudge (broker down, process killed after the commit) only
    costs latency, because beat runs the relay every few seconds anyway. A down broker
    costs one connection attempt (refused at once, or the broker connection timeout
    for a black hole), then this process skips nudges for
    ``NUDGE_PAUSE_AFTER_FAILURE_S``.
    """
    transaction.on_commit(_send_nudge)


_nudge_paused_until = 0.0
_last_nudge_at = float("-inf")
# At most one nudge per process in this interval: commits on the hot paths must not
# each pay for a broker message (docs/outbox.md, "Latency").
NUDGE_MIN_INTERVAL_S = 0.2


def _send_nudge() -> None:
    global _nudge_paused_until
    global _last_nudge_at
    now = time.monotonic()
    if now < _nudge_paused_until:
        return  # the broker failed a moment ago; do not make every commit wait
    if now - _last_nudge_at < NUDGE_MIN_INTERVAL_S:
        return  # a relay run is already on its way and drains whole batches
    _last_nudge_at = now
    try:
        app = portal_jobs.celery_app()
        with app.producer_or_acquire() as producer:
            # One connection attempt, not kombu's default retry loop.
            producer.connection.ensure_connection(max_retries=0)
            app.send_task(
                RELAY_JOB_NAME, expires=NUDGE_EXPIRES_S, retry=False, producer=producer
            )
    except Exception:
        _nudge_paused_until = time.monotonic() + NUDGE_PAUSE_AFTER_FAILURE_S
        logger.warning(
            "could not nudge the outbox relay; beat will pick the rows up",
            exc_info=True,
        )
