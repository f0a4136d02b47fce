"""Recompute the event chains against the signed checkpoints (``verify_audit``).

The checks, per tenant, stop at the first break and name its kind:

- ``forged checkpoint``: a checkpoint whose signature does not verify with a known
  public key (altered columns, another key, an unknown key id);
- ``altered``: an event whose stored hash is not the hash of its content and its
  predecessor's hash, or a chain whose event at a checkpoint's position is not the
  signed one (the chain was rewritten consistently after it was signed);
- ``deleted``: an event whose predecessor is missing, a chain that ends before its
  checkpoint (tail cut), a checkpointed chain that is gone, fewer checkpointed
  events than the tenant's signed count (a chain and its checkpoints removed), or a
  chain that ends before the event its head row names (``audit_chainhead``, which
  the app role may move forward but not delete), a chain gone whose head row stays;
- ``inserted``: a row not written by ``event_append`` (no chain link), two events in
  one place of a chain, an event whose predecessor is further back than the event
  before it, or an event older than the last checkpoint that no checkpoint covers;
- ``reordered``: an event that links to an event after it, or chain numbers that
  disagree with the links.

Events after a chain's last checkpoint are checked for their links and content too;
a cut of that tail is seen by the chain's head row, unless whoever cut it also moved
the head row back, which then only the next checkpoint shows: the window
(docs/audit-integrity.md). The head rows are read before the events, so an append
committed in between leaves the events ahead of their head, never behind.

Retention (docs/retention.md) removes whole ranges; its purges are accepted, not
reported, when their record holds: each purge's tombstone event (code
``audit.purged``, in the tenant's chain, so chained and signed like any event)
repeats the purge record's columns and the SHA-256 of its anchors. A chain cut by a
purge then starts at its anchor (``seq`` + 1, linked to the anchor's hash), and a
checkpoint whose head the purge removed is met by the anchor or lies below it. A
purge record whose tombstone is missing counts only when a later accepted purge
removed that tombstone; otherwise it is ``deleted``, and a tombstone that disagrees
with its record or anchors is ``altered``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection, transaction

from portal import ids

from . import chain, payloads
from .checkpoints import signature_valid
from .models import ChainHead, Checkpoint, EventCode, RetentionAnchor, RetentionPurge
from .tlog import IN_FLIGHT_GRACE  # older uncovered events are reported as inserted

ALTERED: Final = "altered"
DELETED: Final = "deleted"
INSERTED: Final = "inserted"
REORDERED: Final = "reordered"
FORGED_CHECKPOINT: Final = "forged checkpoint"

# An event row as the hash saw it: ``row_content`` turns the first 13 columns into
# the hashed content (also used by the evidence bundle, audit/evidence.py).
EVENT_COLUMNS: Final = f"""
    id, task_id, operation_id, code, actor_type, actor_id, reason_code,
    contract_key, contract_version, payload::text, trace_id, span_id,
    {chain.CREATED_AT_SQL.format(column="created_at")}, created_at,
    chain_seq, prev_hash, hash, payload_digest
"""
_EVENTS: Final = f"""
SELECT {EVENT_COLUMNS}
FROM audit_event WHERE tenant_id = %s
ORDER BY task_id NULLS FIRST, chain_seq NULLS LAST, id
"""


@dataclass(frozen=True)
class Break:
    """The first place where the trail and its checkpoints disagree."""

    kind: str
    chain: str
    detail: str
    event_id: uuid.UUID | None = None
    seq: int | None = None

    def __str__(self) -> str:
        where = f"chain {self.chain}"
        if self.seq is not None:
            where += f" at #{self.seq}"
        if self.event_id is not None:
            where += f" (event {self.event_id})"
        return f"{self.kind}: {where}: {self.detail}"


@dataclass
class Report:
    """What one tenant's verification saw."""

    events: int = 0
    chains: int = 0
    checkpoints: int = 0
    unsigned_tail: int = 0  # events after their chain's last checkpoint
    last_signed_at: dt.datetime | None = None
    broken: Break | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Row:
    id: uuid.UUID
    task_id: uuid.UUID | None
    content: dict[str, Any]
    created_at: dt.datetime
    seq: int | None
    prev_hash: str | None
    hash: str | None
    # False when a v2 event still has its payload and it does not match the digest.
    payload_matches: bool = True
    payload: Any = None


def _chain_name(task_id: uuid.UUID | None) -> str:
    return f"task:{task_id}" if task_id is not None else "tenant"


def row_content(row: Sequence[Any], tenant_id: uuid.UUID) -> dict[str, Any]:
    """The hashed content of a row selected with ``EVENT_COLUMNS`` (format v1 or
    v2: v2 when the row has a ``payload_digest``, its payload then maybe NULL)."""
    payload = chain.stored_payload(row[9]) if row[9] is not None else None
    return chain.event_content(
        event_id=row[0],
        tenant_id=tenant_id,
        task_id=row[1],
        operation_id=row[2],
        code=row[3],
        actor_type=row[4],
        actor_id=row[5],
        reason_code=row[6],
        contract_key=row[7],
        contract_version=row[8],
        payload=payload,
        payload_digest=row[17],
        trace_id=row[10],
        span_id=row[11],
        created_at=row[12],
    )


def _rows(cursor: Any, tenant_id: uuid.UUID) -> Iterator[_Row]:
    cursor.execute(_EVENTS, [tenant_id])
    while batch := cursor.fetchmany(2000):
        yield from _rows_from(batch, tenant_id)


def _rows_from(batch: Sequence[Any], tenant_id: uuid.UUID) -> Iterator[_Row]:
    for r in batch:
        payload = chain.stored_payload(r[9]) if r[9] is not None else None
        digest = r[17]
        matches = (
            digest is None or r[9] is None or chain.payload_digest(payload) == digest
        )
        content = row_content(r, tenant_id)
        yield _Row(r[0], r[1], content, r[13], r[14], r[15], r[16], matches, payload)


def _chains(rows: Iterator[_Row]) -> Iterator[list[_Row]]:
    current: list[_Row] = []
    for row in rows:
        if current and row.task_id != current[0].task_id:
            yield current
            current = []
        current.append(row)
    if current:
        yield current


@dataclass(frozen=True)
class _Anchor:
    seq: int
    event_id: uuid.UUID
    hash: str


def _walk(
    events: Sequence[_Row], name: str, anchor: _Anchor | None = None
) -> Break | None:
    """Check one chain's links and contents, in stored order, from its anchor."""
    position = {row.hash: i for i, row in enumerate(events) if row.hash}
    expected_prev: str | None = anchor.hash if anchor else None
    base = anchor.seq if anchor else 0
    for i, row in enumerate(events):
        if row.seq is None or row.hash is None:
            return Break(
                INSERTED, name, "no chain link: not written by event_append", row.id
            )
        if i and row.seq == events[i - 1].seq:
            return Break(INSERTED, name, "two events in one place", row.id, row.seq)
        if chain.event_hash(prev_hash=row.prev_hash, content=row.content) != row.hash:
            return Break(
                ALTERED, name, "content does not match its hash", row.id, row.seq
            )
        if not row.payload_matches:
            return Break(
                ALTERED, name, "payload does not match its digest", row.id, row.seq
            )
        if row.prev_hash != expected_prev:
            found = position.get(row.prev_hash or "")
            if found is not None and found > i:
                detail = "links to an event stored after it"
                return Break(REORDERED, name, detail, row.id, row.seq)
            if found is not None:
                detail = "the event before it is not the one it links to"
                return Break(INSERTED, name, detail, row.id, row.seq)
            detail = "the event it links to is missing"
            return Break(DELETED, name, detail, row.id, row.seq)
        if row.seq != base + i + 1:
            detail = f"numbered #{row.seq} but linked as #{base + i + 1}"
            return Break(REORDERED, name, detail, row.id, row.seq)
        expected_prev = row.hash
    return None


def _against_checkpoint(
    events: Sequence[_Row],
    checkpoint: Checkpoint | None,
    name: str,
    newest_run: dt.datetime | None,
    anchor: _Anchor | None = None,
) -> tuple[Break | None, int]:
    """Compare a chain with its last checkpoint; returns (break, unsigned events)."""
    base = anchor.seq if anchor else 0
    covered = base
    if checkpoint is not None and checkpoint.head_seq > base:
        covered = checkpoint.head_seq
        if base + len(events) < covered:
            detail = f"ends at #{base + len(events)}, signed up to #{covered}"
            return Break(DELETED, name, detail, checkpoint.head_event_id), 0
        head = events[covered - base - 1]
        if head.id != checkpoint.head_event_id or head.hash != checkpoint.head_hash:
            detail = "not the event and hash the checkpoint signed"
            return Break(ALTERED, name, detail, head.id, head.seq), 0
    elif checkpoint is not None and anchor is not None:
        broken = _against_anchor(checkpoint, anchor, name)
        if broken is not None:
            return broken, 0
    tail = events[covered - base :]
    if newest_run is not None:
        for row in tail:
            if row.created_at < newest_run - IN_FLIGHT_GRACE:
                detail = "older than the last checkpoint, which does not cover it"
                return Break(INSERTED, name, detail, row.id, row.seq), 0
    return None, len(tail)


def _against_head(
    events: Sequence[_Row], head: ChainHead | None, name: str, anchor: _Anchor | None
) -> Break | None:
    """The chain must reach the event its head row names (read before the events).

    A head at or below the chain's anchor was purged by retention: the anchor and
    the checkpoints vouch for that part.
    """
    if head is None or head.head_event_id is None:
        return None
    base = anchor.seq if anchor else 0
    if head.head_seq <= base:
        return None
    if base + len(events) < head.head_seq:
        end = f"ends at #{base + len(events)}" if events else "no events left"
        detail = f"{end}, its head row says #{head.head_seq}"
        return Break(DELETED, name, detail, head.head_event_id)
    row = events[head.head_seq - base - 1]
    if row.id != head.head_event_id or row.hash != head.head_hash:
        detail = "not the event and hash its head row names"
        return Break(ALTERED, name, detail, row.id, row.seq)
    return None


def _against_anchor(checkpoint: Checkpoint, anchor: _Anchor, name: str) -> Break | None:
    """A checkpoint whose head a purge removed must agree with the purge's anchor."""
    if checkpoint.head_seq == anchor.seq and (
        checkpoint.head_event_id != anchor.event_id
        or checkpoint.head_hash != anchor.hash
    ):
        detail = "the purge's anchor is not the event and hash the checkpoint signed"
        return Break(ALTERED, name, detail, anchor.event_id, anchor.seq)
    return None


def anchors_digest(anchors: Sequence[RetentionAnchor]) -> str:
    """SHA-256 of one purge's anchors: what its tombstone's payload carries."""
    return chain.payload_digest(
        sorted(
            (
                {
                    "task_id": str(a.task_id) if a.task_id else None,
                    "seq": a.seq,
                    "event_id": str(a.event_id),
                    "hash": a.hash,
                }
                for a in anchors
            ),
            key=lambda a: (a["task_id"] or "", a["seq"]),
        )
    )


def tombstone_data(
    purge: RetentionPurge, anchors: Sequence[RetentionAnchor]
) -> payloads.AuditPurged:
    """The payload of a purge's tombstone event: its record and its anchors' digest."""
    return {
        "purge_id": str(purge.pk),
        "before_id": str(purge.before_id),
        "events": purge.events,
        "first_event_id": str(purge.first_event_id) if purge.first_event_id else None,
        "last_event_id": str(purge.last_event_id) if purge.last_event_id else None,
        "anchors": len(anchors),
        "anchors_digest": anchors_digest(anchors),
    }


@dataclass
class _Purges:
    """The tenant's accepted purges: anchors per chain and the highest bound."""

    anchors: dict[uuid.UUID | None, _Anchor] = field(default_factory=dict)
    before_id: uuid.UUID | None = None
    broken: Break | None = None


def _purges(tenant_id: uuid.UUID, tombstones: Mapping[str, _Row]) -> _Purges:
    """Check each purge record against its tombstone; collect the accepted anchors."""
    result = _Purges()
    records = list(RetentionPurge.objects.filter(tenant_id=tenant_id))
    by_purge: dict[uuid.UUID, list[RetentionAnchor]] = {}
    for anchor in RetentionAnchor.objects.filter(tenant_id=tenant_id):
        by_purge.setdefault(anchor.purge_id, []).append(anchor)
    accepted: list[RetentionPurge] = []
    missing: list[RetentionPurge] = []
    for record in records:
        row = tombstones.get(str(record.pk))
        if row is None:
            missing.append(record)
            continue
        if row.payload != tombstone_data(record, by_purge.get(record.pk, [])):
            detail = f"tombstone disagrees with purge {record.pk} or its anchors"
            result.broken = Break(ALTERED, "tenant", detail, row.id, row.seq)
            return result
        accepted.append(record)
    highest = max((r.before_id for r in accepted), default=None)
    for record in missing:
        # Its tombstone may itself have gone under a later accepted purge.
        if highest is None or ids.id_time(highest) <= record.purged_at:
            detail = f"purge {record.pk} has no tombstone"
            result.broken = Break(DELETED, "tenant", detail)
            return result
        accepted.append(record)
    for record in accepted:
        for anchor in by_purge.get(record.pk, []):
            known = result.anchors.get(anchor.task_id)
            if known is None or anchor.seq > known.seq:
                result.anchors[anchor.task_id] = _Anchor(
                    anchor.seq, anchor.event_id, anchor.hash
                )
    result.before_id = max((r.before_id for r in accepted), default=None)
    return result


def _tombstones(cursor: Any, tenant_id: uuid.UUID) -> dict[str, _Row]:
    """The tenant's purge tombstones by purge id (their rows, content checked later)."""
    rows = {}
    cursor.execute(
        _EVENTS.replace("WHERE tenant_id = %s", "WHERE tenant_id = %s AND code = %s"),
        [tenant_id, EventCode.AUDIT_PURGED],
    )
    for r in _rows_from(cursor.fetchall(), tenant_id):
        if isinstance(r.payload, dict) and "purge_id" in r.payload:
            rows[str(r.payload["purge_id"])] = r
    return rows


def verify_tenant(
    *,
    tenant_id: uuid.UUID,
    public_keys: Mapping[str, Ed25519PublicKey],
    progress: Callable[[int], None] | None = None,
) -> Report:
    """Verify one tenant's chains against its checkpoints; read-only."""
    report = Report()
    last: dict[uuid.UUID | None, Checkpoint] = {}
    newest: Checkpoint | None = None
    for checkpoint in Checkpoint.objects.filter(tenant_id=tenant_id).order_by(
        "signed_at", "head_seq", "id"
    ):
        report.checkpoints += 1
        if not signature_valid(checkpoint, public_keys=public_keys):
            name = _chain_name(checkpoint.task_id)
            detail = f"checkpoint {checkpoint.pk}: signature does not verify"
            report.broken = Break(
                FORGED_CHECKPOINT,
                name,
                detail,
                checkpoint.head_event_id,
                checkpoint.head_seq,
            )
            return report
        last[checkpoint.task_id] = checkpoint
        newest = checkpoint
    newest_run = newest.signed_at if newest else None
    if newest is not None:
        signed = sum(checkpoint.head_seq for checkpoint in last.values())
        if signed != newest.event_count:
            kind = DELETED if signed < newest.event_count else INSERTED
            detail = (
                f"checkpoints cover {signed} events, the tenant's signed count "
                f"is {newest.event_count}"
            )
            report.broken = Break(kind, "tenant (all chains)", detail)
            return report
    seen: set[uuid.UUID | None] = set()
    # Before the events: a head row read first names an event already committed.
    heads = {
        head.task_id: head
        for head in ChainHead.objects.filter(tenant_id=tenant_id, head_seq__gt=0)
    }
    with transaction.atomic():
        with connection.cursor() as cursor:
            purges = _purges(tenant_id, _tombstones(cursor, tenant_id))
        if purges.broken is not None:
            report.broken = purges.broken
            return report
        broken = _verify_chains(
            tenant_id, report, last, newest_run, purges, seen, progress, heads
        )
    if broken is not None:
        report.broken = broken
        return report
    for task_id, checkpoint in last.items():
        if task_id not in seen:
            anchor = purges.anchors.get(task_id)
            name = _chain_name(task_id)
            if anchor is not None and anchor.seq >= checkpoint.head_seq:
                report.broken = _against_anchor(checkpoint, anchor, name)
                if report.broken is not None:
                    return report
                continue
            detail = f"signed up to #{checkpoint.head_seq}, no events left"
            report.broken = Break(DELETED, name, detail, checkpoint.head_event_id)
            return report
    for task_id, head in heads.items():
        if task_id not in seen:
            anchor = purges.anchors.get(task_id)
            report.broken = _against_head([], head, _chain_name(task_id), anchor)
            if report.broken is not None:
                return report
    report.last_signed_at = newest_run
    return report


def _verify_chains(
    tenant_id: uuid.UUID,
    report: Report,
    last: Mapping[uuid.UUID | None, Checkpoint],
    newest_run: dt.datetime | None,
    purges: _Purges,
    seen: set[uuid.UUID | None],
    progress: Callable[[int], None] | None,
    heads: Mapping[uuid.UUID | None, ChainHead],
) -> Break | None:
    """Walk every chain of the tenant; the first break, if any."""
    with connection.chunked_cursor() as cursor:
        for stored in _chains(_rows(cursor, tenant_id)):
            task_id = stored[0].task_id
            name = _chain_name(task_id)
            seen.add(task_id)
            # Rows a purge covers but whose partition is not dropped yet (the drop
            # waits for every tenant's purge): gone by the record, not checked.
            events = [
                row
                for row in stored
                if purges.before_id is None or row.id >= purges.before_id
            ]
            if not events:
                seen.discard(task_id)
                continue
            report.chains += 1
            report.events += len(events)
            anchor = purges.anchors.get(task_id)
            broken = _walk(events, name, anchor)
            if broken is None:
                broken, unsigned = _against_checkpoint(
                    events, last.get(task_id), name, newest_run, anchor
                )
                report.unsigned_tail += unsigned
            if broken is None:
                broken = _against_head(events, heads.get(task_id), name, anchor)
            if broken is not None:
                return broken
            if progress is not None:
                progress(report.events)
    return None
