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
event count that the other chains' checkpoints do not add up to. When the head still
is not covered after ``SIGN_ATTEMPTS`` runs (appends keep coming, or another run holds
the tenant's checkpoint lock each time), the chain says so (``complete`` false) and
the verifier refuses it as not covered.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from django.db import connection, transaction

from . import checkpoints
from .models import Checkpoint
from .verify import EVENT_COLUMNS, row_content

SIGN_ATTEMPTS: Final = 3

# Every event with this task id, in chain order; rows with no chain link (not written
# by event_append) last, so the verifier sees and reports them.
_CHAIN_EVENTS: Final = f"""
SELECT {EVENT_COLUMNS}
FROM audit_event WHERE tenant_id = %s AND task_id = %s
ORDER BY chain_seq NULLS LAST, id
"""


@dataclass(frozen=True, kw_only=True)
class ChainEvidence:
    """A task chain as stored, and its latest checkpoint (None: never signed)."""

    events: list[dict[str, Any]]
    checkpoint: dict[str, Any] | None

    @property
    def signed_events(self) -> int:
        return self.checkpoint["head_seq"] if self.checkpoint else 0

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
        if not 0 < signed < len(self.events):
            return False
        head = self.events[signed - 1]
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
            and self.checkpoint["head_seq"] == len(self.events)
            and self.checkpoint["head_hash"] == self.events[-1]["hash"]
        )


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
    with connection.cursor() as cursor:
        cursor.execute(_CHAIN_EVENTS, [tenant_id, task_id])
        events = [
            {
                "seq": row[14],
                "prev_hash": row[15],
                "hash": row[16],
                "content": row_content(row, tenant_id),
            }
            for row in cursor.fetchall()
        ]
    return ChainEvidence(
        events=events, checkpoint=checkpoint_json(latest) if latest else None
    )


def task_chain_evidence(
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    key: checkpoints.SigningKey | None = None,
) -> ChainEvidence:
    """The task's chain and a checkpoint covering its head, signed now if needed.

    Must run outside a transaction: signing is the checkpoint job's own durable run
    for the tenant (every moved head of the tenant is signed with it). Read-only when
    the latest checkpoint already covers the head.

    Raises:
        SigningKeyMissing: a checkpoint is needed and no signing key is configured.
    """
    for _ in range(SIGN_ATTEMPTS):
        with transaction.atomic():
            evidence = _read(tenant_id=tenant_id, task_id=task_id)
        if evidence.complete or not evidence.grew_since_signed:
            return evidence
        key = key or checkpoints.signing_key()
        checkpoints.tenant_checkpoint(tenant_id=tenant_id, key=key)
    with transaction.atomic():
        return _read(tenant_id=tenant_id, task_id=task_id)
