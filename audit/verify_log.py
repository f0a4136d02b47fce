"""Check a tenant's transparency log against its events and signed heads.

``manage.py verify_audit`` runs this after the chain walk (audit/verify.py), per
tenant, read-only. It stops at the first break and names its kind, as the chain walk
does:

- ``forged checkpoint``: a tree head's note that no given key signed for the
  tenant's origin (its body or signature changed, another key, another tenant's);
- ``deleted``: a head larger than the log (**the log's tail cut after a head**), a
  position missing inside the log, or a logged event that is gone without a
  retention purge that explains it;
- ``altered``: the log's leaves do not give the newest head's root, or a logged
  event's hash is not the one in the log;
- ``forked``: a head that does not extend the one before it (their RFC 9162
  consistency proof, computed from the log, does not verify);
- ``inserted``: an event older than the newest head by more than the in-flight
  grace that the log does not hold (written around the checkpoint job).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection

from portal import scope
from portal.models import Tenant

from . import merkle, tlog
from .models import RetentionPurge, TreeHead
from .verify import ALTERED, DELETED, FORGED_CHECKPOINT, INSERTED, Break

FORKED = "forked"
CHAIN = "log"  # the Break's place: the tenant's log, not one chain


def head_opens(head: TreeHead, public_keys: Mapping[str, Ed25519PublicKey]) -> bool:
    """True when a given key signed this head's note for its tenant's origin, and
    the note's body says what the row's columns say."""
    public = public_keys.get(head.key_id)
    origin = tlog.origin_of(head.tenant_id)
    if public is None:
        return False
    try:
        body = tlog.note_open(head.note, name=origin, public=public)
        parsed = tlog.checkpoint_parse(body)
    except tlog.NoteError:
        return False
    return (parsed.origin, parsed.size, parsed.root.hex()) == (
        origin,
        head.size,
        head.root_hash,
    )


# A logged event whose row is there with another hash, or gone; "gone" rows
# below a retention purge's bound went the recorded way.
_LOGGED_EVENTS: Final = """
SELECT l.position, l.event_id, e.hash
FROM audit_logentry l
LEFT JOIN audit_event e ON e.tenant_id = l.tenant_id AND e.id = l.event_id
WHERE l.tenant_id = %(tenant_id)s
  AND (e.id IS NULL AND l.event_id >= %(purged_below)s
       OR e.id IS NOT NULL AND e.hash IS DISTINCT FROM l.event_hash)
ORDER BY l.position LIMIT 1
"""
_UNLOGGED: Final = """
SELECT e.id FROM audit_event e
WHERE e.tenant_id = %(tenant_id)s AND e.chain_seq IS NOT NULL
  AND e.created_at < %(before)s
  AND NOT EXISTS (SELECT 1 FROM audit_logentry l
                  WHERE l.tenant_id = %(tenant_id)s AND l.event_id = e.id)
ORDER BY e.id LIMIT 1
"""


def log_verify(
    *, tenant_id: uuid.UUID, public_keys: Mapping[str, Ed25519PublicKey]
) -> tuple[int, int, Break | None]:
    """Verify one tenant's log: (leaves, heads, the first break or None).

    Cost: the leaves in memory (32 bytes each) and one hash per node.
    """
    heads = list(TreeHead.objects.filter(tenant_id=tenant_id).order_by("size"))
    for head in heads:
        if not head_opens(head, public_keys):
            detail = f"tree head {head.pk} of size {head.size}: note does not verify"
            return 0, len(heads), Break(FORGED_CHECKPOINT, CHAIN, detail)
    try:
        tree = tlog.log_tree(tenant_id=tenant_id)
    except ValueError as missing:
        return 0, len(heads), Break(DELETED, CHAIN, str(missing))
    size = len(tree)
    broken = _heads_against_tree(heads, tree)
    if broken is None:
        broken = _log_against_events(tenant_id, heads)
    return size, len(heads), broken


def _heads_against_tree(heads: list[TreeHead], tree: merkle.Tree) -> Break | None:
    if not heads:
        return None
    newest = heads[-1]
    if newest.size > len(tree):
        detail = f"the log has {len(tree)} leaves, signed up to {newest.size}"
        return Break(DELETED, CHAIN, detail)
    if tree.root(newest.size).hex() != newest.root_hash:
        detail = f"the log's first {newest.size} leaves do not give the signed root"
        return Break(ALTERED, CHAIN, detail)
    for older, newer in itertools.pairwise(heads):
        try:
            merkle.verify_consistency(
                old_size=older.size,
                new_size=newer.size,
                old_root=bytes.fromhex(older.root_hash),
                new_root=bytes.fromhex(newer.root_hash),
                proof=tree.consistency_proof(older.size, newer.size),
            )
        except merkle.ProofError as error:
            detail = f"head of {newer.size} does not extend head of {older.size}: "
            return Break(FORKED, CHAIN, detail + str(error))
    return None


def _log_against_events(tenant_id: uuid.UUID, heads: list[TreeHead]) -> Break | None:
    purged = (
        RetentionPurge.objects.filter(tenant_id=tenant_id)
        .order_by("-before_id")
        .values_list("before_id", flat=True)
        .first()
    )
    with connection.cursor() as cursor:
        cursor.execute(
            _LOGGED_EVENTS,
            {"tenant_id": tenant_id, "purged_below": purged or uuid.UUID(int=0)},
        )
        row = cursor.fetchone()
        if row is not None:
            position, event_id, event_hash = row
            kind, what = (
                (ALTERED, "has another hash")
                if event_hash
                else (
                    DELETED,
                    "is gone",
                )
            )
            detail = f"leaf {position}: the logged event {what}"
            return Break(kind, CHAIN, detail, event_id)
        if not heads:
            return None
        cursor.execute(
            _UNLOGGED,
            {
                "tenant_id": tenant_id,
                "before": heads[-1].signed_at - tlog.IN_FLIGHT_GRACE,
            },
        )
        row = cursor.fetchone()
    if row is not None:
        detail = "an event older than the last tree head is not in the log"
        return Break(INSERTED, CHAIN, detail, row[0])
    return None


def tombstone_verify(
    *,
    tenant_id: uuid.UUID,
    note: str,
    size: int,
    root_hash: str,
    key_id: str,
    public_keys: Mapping[str, Ed25519PublicKey],
) -> tuple[int, int, Break | None]:
    """Verify a purged tenant's kept log and the tombstone it ends in.

    The tombstone (tenant_deletion's row: its signed note, and the size, root and
    key id the row repeats) must be a note a given key signed for the tenant's
    origin, carry the tombstone line and say what the row says (else ``forged
    checkpoint``); the kept heads must verify and extend one another, and the
    tombstone must extend the newest, its root that of the log's leaves
    (``forked``, ``altered``, ``deleted`` as for a live log); a log longer than
    its tombstone is ``inserted``. The events are gone (purged), so they are not
    compared. Returns (leaves, signed heads, the first break or None).
    """
    public = public_keys.get(key_id)
    try:
        if public is None:
            raise tlog.NoteError(f"no given key has the id {key_id}")
        body = tlog.note_open(note, name=tlog.origin_of(tenant_id), public=public)
        parsed = tlog.checkpoint_parse(body)
    except tlog.NoteError as error:
        detail = f"the tombstone of size {size} does not verify: {error}"
        return 0, 0, Break(FORGED_CHECKPOINT, CHAIN, detail)
    if not parsed.tombstone or (parsed.size, parsed.root.hex()) != (size, root_hash):
        detail = "the tombstone's note is not a tombstone of the size and root it names"
        return 0, 0, Break(FORGED_CHECKPOINT, CHAIN, detail)
    heads = list(TreeHead.objects.filter(tenant_id=tenant_id).order_by("size"))
    for head in heads:
        if not head_opens(head, public_keys):
            detail = f"tree head {head.pk} of size {head.size}: note does not verify"
            return 0, len(heads), Break(FORGED_CHECKPOINT, CHAIN, detail)
    try:
        tree = tlog.log_tree(tenant_id=tenant_id)
    except ValueError as missing:
        return 0, len(heads), Break(DELETED, CHAIN, str(missing))
    last = TreeHead(tenant_id=tenant_id, size=size, root_hash=root_hash)
    broken = _heads_against_tree([*heads, last], tree)
    if broken is None and len(tree) > size:
        detail = f"the log goes on after its tombstone: {len(tree)} leaves, not {size}"
        broken = Break(INSERTED, CHAIN, detail)
    return len(tree), len(heads), broken


def purged_tenant_ids() -> list[uuid.UUID]:
    """The tenants whose row is gone but whose log heads or tombstone stay: the
    purged ones, and any whose trail went around the purge (without a tombstone).
    Asks the discovery function ``audit_tenants_with_log``, which sees every
    tenant's (docs/database-roles.md)."""
    live = set(Tenant.objects.values_list("pk", flat=True))
    found = (
        uuid.UUID(tenant_id) for tenant_id in scope.discover("audit_tenants_with_log")
    )
    return [tenant_id for tenant_id in found if tenant_id not in live]
