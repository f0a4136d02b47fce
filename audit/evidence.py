"""One chain's links and the signed checkpoint that covers it, for an evidence bundle.

The part of a task's evidence bundle that can be checked offline (docs/audit-
integrity.md, "Evidence bundles"): every event of the chain with its number, its
predecessor's hash, its own hash and the content exactly as hashed; and the chain's
latest checkpoint with every signed column. ``tools/verify_bundle.py`` recomputes the
hashes, follows the links and checks the signature with the published public key.

A checkpoint is signed on demand when the chain's newest events are not covered yet
(the minute job may not have run since), so a bundle exported right after the task
moved still verifies. Only a chain that grew past its checkpoint is signed: one that
is shorter than its checkpoint or differs at the signed head is exported as it is,
for the verifier to report. The signing is the job's own run for the tenant
(``tenant_checkpoint``): a checkpoint row for one chain alone would carry a tenant
event count that the other chains' checkpoints do not add up to.

Who signs: the web server holds no signing key (``portal.process``), so an export
there sends ``audit.jobs.checkpoint_tenant_job`` to the Celery workers and reads the
chain again until a checkpoint covers it or ``PORTAL_EVIDENCE_SIGN_WAIT_S`` has
passed. Any other process (a management command, a test) holds the key and signs
itself, up to ``SIGN_ATTEMPTS`` runs. When the head still is not covered (no worker
answered in time, appends keep coming, or another run holds the tenant's checkpoint
lock each time), the chain says so (``complete`` false) and the verifier refuses it
as not covered.

Chain format v2 events (audit/chain.py) carry their ``payload_digest`` in the hashed
content and the stored payload beside it (``payload``, None once retention dropped
it). A chain that retention purged (docs/retention.md) starts after its anchor: the
first event links to the anchor's hash and is numbered ``anchor.seq`` + 1; the
bundle carries the anchor, which only ``manage.py verify_audit`` can prove (by its
``audit.purged`` tombstone in the tenant's chain), so the offline verifier checks
everything after it and then says it cannot vouch for the anchor.

The bundle also carries the tenant's transparency log's newest signed tree head
(a C2SP checkpoint note, audit/tlog.py) and, for each exported event in the log,
its leaf index and RFC 9162 inclusion proof in that head (``log``): a third party
checks one event against the signed head without the rest of the trail, and a
witness that saw later heads can check that they extend it.

Where witnesses (``PORTAL_AUDIT_WITNESSES``) or a TSA (``PORTAL_AUDIT_TSA_URL``)
are configured, the export also waits, in the same loop and within the same
bound, for that head's stamps: the worker stores them after its run commits, so
a head read at once would lack them. ``log.stamps`` says which were expected and
which had not arrived when the bundle was read (``complete`` false, and a note
telling the reader to export again); never a silent omission.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from django.conf import settings
from django.db import connection, transaction

from portal import jobs as portal_jobs
from portal import process

from . import chain, checkpoints, jobs, merkle, tlog, witness_client
from .models import Checkpoint, HeadStamp, LogEntry, RetentionAnchor, TreeHead
from .verify import EVENT_COLUMNS, row_content

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
SIGN_ATTEMPTS: Final = 3
# How often the web reads the chain again while a worker signs.
SIGN_POLL_S: Final = 0.1

# Every event with this task id, in chain order; rows with no chain link (not written
# by event_append) last, so the verifier sees and reports them.
_CHAIN_EVENTS: Final = f"""
SELECT {EVENT_COLUMNS}
FROM audit_event WHERE tenant_id = %s AND task_id = %s
ORDER BY chain_seq NULLS LAST, id
"""


@dataclass(frozen=True, kw_only=True)
class ChainEvidence:
    """A task chain as stored, its latest checkpoint (None: never signed) and, for
    a chain retention purged, the anchor it continues from (None: it starts at #1)."""

    events: list[dict[str, Any]]
    checkpoint: dict[str, Any] | None
    anchor: dict[str, Any] | None = None
    # The newest signed tree head and each logged event's inclusion proof in it;
    # None when no head was signed yet.
    log: dict[str, Any] | None = None

    @property
    def first_seq(self) -> int:
        """The number the chain's first exported event should have."""
        return (self.anchor["seq"] if self.anchor else 0) + 1

    @property
    def signed_events(self) -> int:
        """How many of the exported events the checkpoint signs (numbers up to its
        head; the purged ones before the anchor are not exported)."""
        if not self.checkpoint:
            return 0
        return max(self.checkpoint["head_seq"] - self.first_seq + 1, 0)

    def _at(self, seq: int) -> dict[str, Any] | None:
        index = seq - self.first_seq
        return self.events[index] if 0 <= index < len(self.events) else None

    @property
    def grew_since_signed(self) -> bool:
        """Whether the chain only grew since its checkpoint: the signed head is
        still where it was signed, with newer events after it (or nothing was ever
        signed). Signing on demand is for this case alone; a chain shorter than its
        checkpoint, or different at the signed head, is exported as it is for the
        verifier to report, never signed over."""
        if self.checkpoint is None:
            return bool(self.events)
        signed = self.checkpoint["head_seq"]
        if not self.events or signed >= self.events[-1]["seq"]:
            return False
        head = self._at(signed)
        if head is None:  # signed below the anchor: the purge removed its head
            return signed < self.first_seq
        return (
            head["seq"] == signed
            and head["hash"] == self.checkpoint["head_hash"]
            and head["content"]["id"] == self.checkpoint["head_event_id"]
        )

    @property
    def complete(self) -> bool:
        """Whether the checkpoint signs the newest event read (no unsigned tail)."""
        if not self.events:
            return self.checkpoint is None
        return (
            self.checkpoint is not None
            and self.checkpoint["head_seq"] == self.events[-1]["seq"]
            and self.checkpoint["head_hash"] == self.events[-1]["hash"]
        )


def event_payload(event: dict[str, Any]) -> Any:
    """An exported event's payload: in the content (v1) or beside it (v2, None
    once dropped)."""
    if event["content"].get("v") == chain.FORMAT_V1:
        return event["content"]["payload"]
    return event.get("payload")


def checkpoint_json(checkpoint: Checkpoint) -> dict[str, Any]:
    """A checkpoint as a bundle carries it: the signed fields, as signed, and the
    signature (``checkpoints.signed_message`` is the RFC 8785 JSON of exactly the
    fields from ``v`` to ``key_id``)."""
    return {
        "id": str(checkpoint.pk),
        "algorithm": "Ed25519",
        "v": checkpoints.SIGNATURE_FORMAT_VERSION,
        "tenant_id": str(checkpoint.tenant_id),
        "task_id": str(checkpoint.task_id) if checkpoint.task_id else None,
        "head_seq": checkpoint.head_seq,
        "head_event_id": str(checkpoint.head_event_id),
        "head_hash": checkpoint.head_hash,
        "event_count": checkpoint.event_count,
        "signed_at": checkpoints.signed_at_text(checkpoint.signed_at),
        "key_id": checkpoint.key_id,
        "signature": checkpoint.signature,
    }


def _read(*, tenant_id: uuid.UUID, task_id: uuid.UUID) -> ChainEvidence:
    # The checkpoint first: an event committed before it was signed is visible to
    # the events query after it, so a checkpoint never seems to sign a missing event.
    latest = (
        Checkpoint.objects.filter(tenant_id=tenant_id, task_id=task_id)
        .order_by("-signed_at", "-head_seq")
        .first()
    )
    head = TreeHead.objects.filter(tenant_id=tenant_id).order_by("-size").first()
    with connection.cursor() as cursor:
        cursor.execute(_CHAIN_EVENTS, [tenant_id, task_id])
        events = [_event_json(row, tenant_id) for row in cursor.fetchall()]
    first = events[0]["seq"] if events else None
    anchors = RetentionAnchor.objects.filter(tenant_id=tenant_id, task_id=task_id)
    if isinstance(first, int):
        anchors = anchors.filter(seq__lt=first)
    anchor = anchors.order_by("-seq").first()
    return ChainEvidence(
        events=events,
        checkpoint=checkpoint_json(latest) if latest else None,
        anchor=anchor_json(anchor) if anchor else None,
        log=_log_json(tenant_id=tenant_id, head=head, events=events) if head else None,
    )


def _log_json(
    *,
    tenant_id: uuid.UUID,
    head: TreeHead,
    events: list[dict[str, Any]],
    tree: merkle.Tree | None = None,
) -> dict[str, Any]:
    """The signed head's note and an inclusion proof for each exported event it
    covers (events placed after the head, or never, have none: the verifier names
    them). Reads the log's leaves up to the head: 32 bytes each."""
    ids = [event["content"]["id"] for event in events]
    positions = dict(
        LogEntry.objects.filter(
            tenant_id=tenant_id, event_id__in=ids, position__lt=head.size
        ).values_list("event_id", "position")
    )
    tree = tree or tlog.log_tree(tenant_id=tenant_id, size=head.size)
    proofs = [
        {
            "event_id": str(event_id),
            "index": index,
            "proof": [node.hex() for node in tree.inclusion_proof(index, head.size)],
        }
        for event_id, index in sorted(positions.items(), key=lambda item: item[1])
    ]
    # The witnesses' cosignature lines join the note's signatures (C2SP style);
    # RFC 3161 tokens ride beside it (audit/witness_client.py, audit/timestamp.py).
    stamps = list(HeadStamp.objects.filter(tree_head=head).order_by("kind", "signer"))
    log: dict[str, Any] = {
        "format": "c2sp.org/tlog-checkpoint, c2sp.org/signed-note (Ed25519)",
        "tree": "RFC 9162 2.1: leaf = SHA-256(0x00 || event hash bytes), "
        "node = SHA-256(0x01 || left || right)",
        "checkpoint": head.note
        + "".join(s.stamp for s in stamps if s.kind == HeadStamp.Kind.COSIGNATURE),
        "inclusion": proofs,
        "rfc3161": [
            {"tsa": s.signer, "token": s.stamp}
            for s in stamps
            if s.kind == HeadStamp.Kind.RFC3161
        ],
    }
    expected = stamps_expected()
    if expected:
        log["stamps"] = _stamps_json(
            expected, have={(s.kind, s.signer) for s in stamps}
        )
    return log


def stamps_expected() -> list[tuple[str, str]]:
    """The stamps a new head gets after its run commits, as ``head_vouch`` asks
    for them: each configured witness's cosignature and the TSA's token, as
    ``(kind, signer)``."""
    try:
        witnesses = witness_client.configured()
    except witness_client.WitnessConfigError:
        witnesses = []  # head_vouch witnesses nothing either (and logs why)
    expected = [(HeadStamp.Kind.COSIGNATURE.value, w.name) for w in witnesses]
    if settings.PORTAL_AUDIT_TSA_URL:
        expected.append((HeadStamp.Kind.RFC3161.value, settings.PORTAL_AUDIT_TSA_URL))
    return expected


def _stamp_name(kind: str, signer: str) -> str:
    if kind == HeadStamp.Kind.COSIGNATURE:
        return f"cosignature of witness {signer}"
    return f"RFC 3161 token of TSA {signer}"


def _stamps_json(
    expected: list[tuple[str, str]], *, have: set[tuple[str, str]]
) -> dict[str, Any]:
    """What vouches for the head from outside, against what is configured: a
    description for the reader (the verifier checks the stamps themselves)."""
    missing = [stamp for stamp in expected if stamp not in have]
    if not missing:
        note = "The tree head carries every configured stamp."
    else:
        kinds = {kind for kind, _ in missing}
        says = " and ".join(
            word
            for kind, word in (
                (HeadStamp.Kind.COSIGNATURE, "'not witnessed' (--witness-key)"),
                (HeadStamp.Kind.RFC3161, "'not timestamped' (--tsa-root)"),
            )
            if kind in kinds
        )
        note = (
            "The tree head's "
            + "; ".join(_stamp_name(*stamp) for stamp in missing)
            + f" had not arrived when the bundle was read (waited up to "
            f"{settings.PORTAL_EVIDENCE_SIGN_WAIT_S:g} s): tools/verify_bundle.py "
            f"says {says}. Export it again in a minute; if that does not help, "
            "the witness or TSA is not answering the portal's workers."
        )
    return {
        "complete": not missing,
        "expected": [_stamp_name(*stamp) for stamp in expected],
        "missing": [_stamp_name(*stamp) for stamp in missing],
        "note": note,
    }


def _event_json(row: Any, tenant_id: uuid.UUID) -> dict[str, Any]:
    event = {
        "seq": row[14],
        "prev_hash": row[15],
        "hash": row[16],
        "content": row_content(row, tenant_id),
    }
    if row[17] is not None:  # v2: the digest is hashed, the payload rides along
        event["payload"] = chain.stored_payload(row[9]) if row[9] is not None else None
    return event


def anchor_json(anchor: RetentionAnchor) -> dict[str, Any]:
    """Where a purged chain continues from (audit_retentionanchor)."""
    return {
        "purge_id": str(anchor.purge_id),
        "seq": anchor.seq,
        "event_id": str(anchor.event_id),
        "hash": anchor.hash,
    }


def task_chain_evidence(
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    key: checkpoints.SigningKey | None = None,
) -> ChainEvidence:
    """The task's chain and a checkpoint covering its head, signed now if needed:
    by a Celery worker when this is the web server, else here.

    Must run outside a transaction: signing is the checkpoint job's own durable run
    for the tenant (every moved head of the tenant is signed with it), and the web
    waits for a worker's commit. Read-only when the latest checkpoint already
    covers the head. In the web, waits at most ``PORTAL_EVIDENCE_SIGN_WAIT_S`` (a
    broker that refuses the job: not at all), then returns the chain as it is.

    Raises:
        SigningKeyMissing: outside the web, a checkpoint is needed and no signing
            key is configured.
    """
    return _signed_until(
        tenant_id=tenant_id,
        read=lambda: _read(tenant_id=tenant_id, task_id=task_id),
        covered=lambda evidence: evidence.complete or not evidence.grew_since_signed,
        key=key,
    )


@dataclass(frozen=True, kw_only=True)
class ExportEvidence:
    """The export record (an ``audit.exported`` event binding the bundle's sections)
    and the log that proves it: the newest signed tree head, the chain's events'
    inclusion proofs in it (``log``) and the record's (``export``; its ``index`` and
    ``proof`` None while no signed head holds it yet)."""

    log: dict[str, Any] | None
    export: dict[str, Any]

    @property
    def covered(self) -> bool:
        return self.export["proof"] is not None

    @property
    def stamped(self) -> bool:
        """Whether the head carries every configured stamp (True when none is)."""
        stamps = self.log.get("stamps") if self.log else None
        return stamps is None or bool(stamps["complete"])


_EVENT: Final = (
    f"SELECT {EVENT_COLUMNS} FROM audit_event WHERE tenant_id = %s AND id = %s"
)


def _read_export(
    *, tenant_id: uuid.UUID, event_id: uuid.UUID, events: list[dict[str, Any]]
) -> ExportEvidence:
    head = TreeHead.objects.filter(tenant_id=tenant_id).order_by("-size").first()
    with connection.cursor() as cursor:
        cursor.execute(_EVENT, [tenant_id, event_id])
        record = _event_json(cursor.fetchone(), tenant_id)
    position = (
        LogEntry.objects.filter(
            tenant_id=tenant_id, event_id=event_id, position__lt=head.size
        )
        .values_list("position", flat=True)
        .first()
        if head
        else None
    )
    export: dict[str, Any] = {"event": record, "index": position, "proof": None}
    if head is None:
        return ExportEvidence(log=None, export=export)
    tree = tlog.log_tree(tenant_id=tenant_id, size=head.size)
    if position is not None:
        proof = tree.inclusion_proof(position, head.size)
        export["proof"] = [node.hex() for node in proof]
    return ExportEvidence(
        log=_log_json(tenant_id=tenant_id, head=head, events=events, tree=tree),
        export=export,
    )


def export_evidence(
    *,
    tenant_id: uuid.UUID,
    event_id: uuid.UUID,
    events: list[dict[str, Any]],
    key: checkpoints.SigningKey | None = None,
) -> ExportEvidence:
    """The export record ``event_id`` with its inclusion proof in a signed tree
    head (signed now if needed, as ``task_chain_evidence`` signs), and that head's
    proofs of ``events`` (the bundle's chain). Outside a transaction.

    Where witnesses or a TSA are configured, the head's stamps are awaited too
    (in the web within the same ``PORTAL_EVIDENCE_SIGN_WAIT_S``); when they do not
    come, ``log.stamps`` says which are missing.

    Raises:
        SigningKeyMissing: outside the web, a head is needed and no signing key is
            configured.
    """
    return _signed_until(
        tenant_id=tenant_id,
        read=lambda: _read_export(
            tenant_id=tenant_id, event_id=event_id, events=events
        ),
        covered=lambda evidence: evidence.covered,
        key=key,
        stamped=lambda evidence: evidence.stamped,
    )


def _signed_until(
    *,
    tenant_id: uuid.UUID,
    read: Callable[[], _T],
    covered: Callable[[_T], bool],
    key: checkpoints.SigningKey | None,
    stamped: Callable[[_T], bool] = lambda _: True,
) -> _T:
    """``read()`` (in a transaction) until ``covered`` and ``stamped`` say so,
    having the tenant's checkpoint run sign what is new: by a worker when this is
    the web server (it waits at most ``PORTAL_EVIDENCE_SIGN_WAIT_S`` for both),
    else here, up to ``SIGN_ATTEMPTS`` runs, each of which has the new head
    stamped before it returns. Returns the last read, covered or not."""
    if process.is_web():
        return _signed_by_worker(
            tenant_id=tenant_id, read=read, covered=covered, stamped=stamped
        )
    ran = False
    for _ in range(SIGN_ATTEMPTS):
        with transaction.atomic():
            found = read()
        if covered(found):
            break
        key = key or checkpoints.signing_key()
        # The job's own run for the tenant, and the witnesses' and TSA's stamps
        # on its head once committed, as the worker's run has them.
        checkpoints.tenant_checkpoint_scoped(tenant_id=tenant_id, key=key)
        ran = True
    else:
        with transaction.atomic():
            return read()
    if stamped(found) or ran:
        return found
    # Signed by another process's run, whose stamps may not be stored yet: ask
    # for them here, as that run does (what is there already is not asked again).
    witness_client.head_vouch(tenant_id=tenant_id)
    with transaction.atomic():
        return read()


def _signed_by_worker(
    *,
    tenant_id: uuid.UUID,
    read: Callable[[], _T],
    covered: Callable[[_T], bool],
    stamped: Callable[[_T], bool],
) -> _T:
    deadline = time.monotonic() + settings.PORTAL_EVIDENCE_SIGN_WAIT_S
    asked = False
    while True:
        with transaction.atomic():
            found = read()
        signed = covered(found)
        if signed and stamped(found):
            return found
        if not signed and not asked:
            if not _ask_worker(tenant_id=tenant_id):
                return found
            asked = True
        if time.monotonic() >= deadline:
            if signed:
                logger.warning(
                    "evidence export of tenant %s: the tree head's stamps did not "
                    "arrive within %s s; the bundle says which are missing",
                    tenant_id,
                    settings.PORTAL_EVIDENCE_SIGN_WAIT_S,
                )
            return found
        # The worker commits the head, then asks the witnesses and the TSA: the
        # stamps come after the head, so the head alone is not yet the answer.
        time.sleep(SIGN_POLL_S)


def _ask_worker(*, tenant_id: uuid.UUID) -> bool:
    """Send the tenant's checkpoint job; False when the broker refused it."""
    app = portal_jobs.celery_app()  # the configured app, not celery's default one

    try:
        with app.producer_or_acquire() as producer:
            # One connection attempt, not kombu's default retry loop.
            producer.connection.ensure_connection(max_retries=0)
            app.send_task(
                jobs.CHECKPOINT_TENANT_JOB_NAME,
                kwargs={"tenant_id": str(tenant_id)},
                expires=settings.PORTAL_EVIDENCE_SIGN_WAIT_S,
                retry=False,
                producer=producer,
            )
    except Exception:
        logger.warning(
            "could not ask a worker for a checkpoint; the export goes out with the "
            "chain as signed so far",
            exc_info=True,
        )
        return False
    return True
