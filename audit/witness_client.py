"""The portal's side of the witnesses: submit tree heads, keep and check cosignatures.

After a checkpoint run commits (``audit.checkpoints.tenant_checkpoint_scoped``),
``head_vouch`` sends the tenant's newest tree head to each configured witness
(``PORTAL_AUDIT_WITNESSES``, C2SP ``tlog-witness`` ``add-checkpoint``, with an RFC
9162 consistency proof from the last head that witness cosigned), stores each
cosignature as an ``audit_headstamp`` row, asks the time-stamping authority for
an RFC 3161 token (audit/timestamp.py) and appends the head to the tenant's
append-only export (audit/export.py). No transaction is open during the HTTP calls:
each read and each write is its own.

``stamps_verify`` is what ``verify_audit`` runs per tenant when witnesses or a
TSA root are configured (docs/audit-integrity.md, "Witnesses", "Timestamps").
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.db import IntegrityError, connection, transaction

from portal import scope

from . import export, merkle, timestamp, tlog, witness
from .models import HeadStamp, TreeHead
from .verify import Break

logger = logging.getLogger(__name__)

FORGED_COSIGNATURE: Final = "forged cosignature"
REPLAYED_COSIGNATURE: Final = "replayed cosignature"
NOT_WITNESSED: Final = "not witnessed"
PLACE: Final = "witness"
# A head signed longer ago than this must carry every witness's cosignature (the
# checkpoint job submits each new head right after signing it).
WITNESS_GRACE: Final = tlog.IN_FLIGHT_GRACE
# How far a witness's clock may trail the database's before a cosignature older
# than the head it is on counts as replayed.
CLOCK_SKEW: Final = dt.timedelta(seconds=60)
# A witness that did not answer is left alone this long by this process, so that
# one run over many tenants does not wait for it once per tenant.
DOWN_FOR_S: Final = 60.0
_down_until: dict[str, float] = {}


class WitnessConfigError(ValueError):
    """A ``PORTAL_AUDIT_WITNESSES`` entry that is not ``<vkey> <url>``."""


@dataclass(frozen=True)
class WitnessConfig:
    name: str
    public: Ed25519PublicKey
    url: str


def witness_parse(entry: str) -> WitnessConfig:
    vkey, _, url = entry.strip().partition(" ")
    url = url.strip()
    try:
        name, public = witness.verifier_key_parse(vkey)
    except witness.CosignatureError as error:
        raise WitnessConfigError(f"{entry!r}: {error}") from None
    if url and not url.startswith(("http://", "https://")):
        raise WitnessConfigError(f"{entry!r}: the URL is not http(s)")
    return WitnessConfig(name=name, public=public, url=url.rstrip("/"))


def configured() -> list[WitnessConfig]:
    return [witness_parse(entry) for entry in settings.PORTAL_AUDIT_WITNESSES]


def head_body(head: TreeHead) -> str:
    return head.note.rpartition("\n\n")[0] + "\n"


def _cosigned_sizes(tenant_id: uuid.UUID, name: str) -> dict[int, TreeHead]:
    rows = HeadStamp.objects.filter(
        tenant_id=tenant_id, kind=HeadStamp.Kind.COSIGNATURE, signer=name
    ).select_related("tree_head")
    return {row.tree_head.size: row.tree_head for row in rows}


def _submit(
    config: WitnessConfig, head: TreeHead, old_size: int, client: httpx.Client
) -> httpx.Response:
    return _submit_note(
        config,
        tenant_id=head.tenant_id,
        note=head.note,
        size=head.size,
        old_size=old_size,
        client=client,
    )


def _submit_note(
    config: WitnessConfig,
    *,
    tenant_id: uuid.UUID,
    note: str,
    size: int,
    old_size: int,
    client: httpx.Client,
) -> httpx.Response:
    proof: list[bytes] = []
    if 0 < old_size < size:
        tree = tlog.log_tree(tenant_id=tenant_id, size=size)
        proof = tree.consistency_proof(old_size, size)
    lines = [f"old {old_size}", *(merkle_b64(node) for node in proof)]
    body = "".join(f"{line}\n" for line in lines) + "\n" + note
    return client.post(
        f"{config.url}/add-checkpoint",
        content=body.encode("utf-8"),
        timeout=settings.PORTAL_AUDIT_WITNESS_TIMEOUT_S,
    )


def merkle_b64(node: bytes) -> str:
    return base64.b64encode(node).decode("ascii")


@dataclass(frozen=True)
class Cosigned:
    """A witness's cosignature line on a note, and the time it carries."""

    line: str
    stamped_at: dt.datetime


def note_cosign(
    *,
    tenant_id: uuid.UUID,
    note: str,
    size: int,
    config: WitnessConfig,
    client: httpx.Client,
) -> Cosigned | None:
    """Ask one witness to cosign ``note`` (a signed checkpoint of the tenant's log
    of ``size`` leaves: a tree head, or a purged tenant's tombstone).

    The old size is the last head this witness cosigned (from the stored
    cosignatures); on 409 the witness's own size is used once, when the log has a
    head of that size. Returns None when the witness refused or did not answer
    (logged). Outside any transaction.
    """
    sizes = _cosigned_sizes(tenant_id, config.name)
    old = max((known for known in sizes if known <= size), default=0)

    def submit(old_size: int) -> httpx.Response:
        return _submit_note(
            config,
            tenant_id=tenant_id,
            note=note,
            size=size,
            old_size=old_size,
            client=client,
        )

    try:
        response = submit(old)
        if response.status_code == 409:
            theirs = int(response.text.strip())
            if theirs <= size and (
                theirs == 0
                or TreeHead.objects.filter(tenant_id=tenant_id, size=theirs).exists()
            ):
                response = submit(theirs)
    except (httpx.HTTPError, ValueError) as error:
        if isinstance(error, httpx.TransportError):
            _down_until[config.name] = time.monotonic() + DOWN_FOR_S
        logger.warning("witness %s: head %s not cosigned: %s", config.name, size, error)
        return None
    if response.status_code != 200:
        answer = f"{response.status_code} {response.text.strip()}"
        logger.warning(
            "witness %s refused head %s of %s: %s",
            config.name,
            size,
            tenant_id,
            answer,
        )
        return None
    body = note.rpartition("\n\n")[0] + "\n"
    for cosig in witness.cosignature_lines(response.text):
        try:
            stamp = witness.cosignature_open(
                cosig.line, body=body, name=config.name, public=config.public
            )
        except witness.CosignatureError:
            continue
        return Cosigned(
            line=cosig.line, stamped_at=dt.datetime.fromtimestamp(stamp, dt.UTC)
        )
    logger.warning("witness %s answered no valid cosignature", config.name)
    return None


def head_witness(
    head: TreeHead, config: WitnessConfig, client: httpx.Client
) -> HeadStamp | None:
    """Ask one witness to cosign ``head`` (``note_cosign``); store and return its
    cosignature. None when it did not cosign (the next run submits the next
    head), or another run stored this witness's first."""
    cosigned = note_cosign(
        tenant_id=head.tenant_id,
        note=head.note,
        size=head.size,
        config=config,
        client=client,
    )
    if cosigned is None:
        return None
    try:
        with transaction.atomic():
            return HeadStamp.objects.create(
                tenant_id=head.tenant_id,
                tree_head=head,
                kind=HeadStamp.Kind.COSIGNATURE,
                signer=config.name,
                stamp=cosigned.line,
                stamped_at=cosigned.stamped_at,
            )
    except IntegrityError:  # another run stored this witness's first
        return None


def vouching_configured() -> bool:
    return bool(
        settings.PORTAL_AUDIT_WITNESSES
        or settings.PORTAL_AUDIT_TSA_URL
        or settings.PORTAL_AUDIT_EXPORT_DIR
    )


def head_vouch(*, tenant_id: uuid.UUID) -> None:
    """After a checkpoint run committed: the newest head to the witnesses, to the
    TSA and to the export. Outside any transaction; failures are logged, never
    raised (the head stays signed; verify_audit reports what is missing)."""
    if connection.in_atomic_block:
        raise RuntimeError("head_vouch calls out over HTTP: never inside a transaction")
    try:
        witnesses = configured()
    except WitnessConfigError:
        logger.exception("PORTAL_AUDIT_WITNESSES is malformed: no head is witnessed")
        witnesses = []
    with scope.tenant_scope([tenant_id]):
        head = TreeHead.objects.filter(tenant_id=tenant_id).order_by("-size").first()
        if head is None:
            return
        have = set(
            HeadStamp.objects.filter(tree_head=head).values_list("kind", "signer")
        )
        with httpx.Client() as client:
            for config in witnesses:
                if _down_until.get(config.name, 0.0) > time.monotonic():
                    continue  # it did not answer a moment ago: the next run
                if (HeadStamp.Kind.COSIGNATURE, config.name) not in have:
                    head_witness(head, config, client)
            url = settings.PORTAL_AUDIT_TSA_URL
            if url and (HeadStamp.Kind.RFC3161, url) not in have:
                timestamp.head_timestamp(head, url=url, client=client)
        if settings.PORTAL_AUDIT_EXPORT_DIR:
            export.head_export(head)


# --- verifying ----------------------------------------------------------------------


def stamps_verify(
    *,
    tenant_id: uuid.UUID,
    heads: Sequence[TreeHead],
    witnesses: Sequence[WitnessConfig],
    tsa_roots: Sequence[timestamp.Certificate] = (),
    now: dt.datetime | None = None,
) -> Break | None:
    """Every stored cosignature and token against its head, and that every head
    older than the grace is cosigned by each witness (or a later one is).

    Kinds: ``forged cosignature`` (a line that is not the witness's signature on
    its head: another key, altered bytes), ``replayed cosignature`` (a genuine
    cosignature of another head moved onto this one, or one dated before its head
    was signed), ``not witnessed`` (a head past the grace no cosignature covers),
    and timestamp.py's ``forged timestamp`` / ``timestamp for another head``.
    """
    now = now or dt.datetime.now(dt.UTC)
    by_id = {head.pk: head for head in heads}
    bodies = {head.pk: head_body(head) for head in heads}
    stamps = HeadStamp.objects.filter(tenant_id=tenant_id).order_by("created_at", "id")
    cosigned: dict[str, int] = {}
    for row in stamps:
        head = by_id.get(row.tree_head_id)
        if head is None:
            continue
        if row.kind == HeadStamp.Kind.RFC3161:
            if tsa_roots:
                broken = timestamp.stamp_verify(
                    row, head=head, body=bodies[head.pk], roots=tsa_roots
                )
                if broken is not None:
                    return broken
            continue
        config = next((w for w in witnesses if w.name == row.signer), None)
        if config is None:
            continue
        broken = cosignature_check(
            row.stamp, head=head, body=bodies[head.pk], config=config, others=bodies
        )
        if broken is not None:
            return broken
        cosigned[config.name] = max(cosigned.get(config.name, 0), head.size)
    due = [head for head in heads if head.signed_at < now - WITNESS_GRACE]
    if due:
        for config in witnesses:
            if cosigned.get(config.name, 0) < due[-1].size:
                detail = (
                    f"tree head of {due[-1].size} (signed "
                    f"{due[-1].signed_at:%Y-%m-%dT%H:%M:%SZ}) has no cosignature by "
                    f"witness {config.name}, nor does a later one"
                )
                return Break(NOT_WITNESSED, PLACE, detail)
    return None


def cosignature_check(
    line: str,
    *,
    head: TreeHead,
    body: str,
    config: WitnessConfig,
    others: dict[uuid.UUID, str],
) -> Break | None:
    where = f"tree head of {head.size}, witness {config.name}"
    try:
        stamp = witness.cosignature_open(
            line, body=body, name=config.name, public=config.public
        )
    except witness.CosignatureError as error:
        for other_id, other in others.items():
            if other_id == head.pk:
                continue
            try:
                witness.cosignature_open(
                    line, body=other, name=config.name, public=config.public
                )
            except witness.CosignatureError:
                continue
            detail = f"{where}: the cosignature is the witness's on another head"
            return Break(REPLAYED_COSIGNATURE, PLACE, detail)
        return Break(FORGED_COSIGNATURE, PLACE, f"{where}: {error}")
    signed = int(head.signed_at.timestamp())
    if stamp < signed - CLOCK_SKEW.total_seconds():
        detail = f"{where}: cosigned at {stamp}, before the head was signed ({signed})"
        return Break(REPLAYED_COSIGNATURE, PLACE, detail)
    return None


def tombstone_stamps_verify(
    *,
    tenant_id: uuid.UUID,
    note: str,
    size: int,
    signed_at: dt.datetime,
    stamps: Sequence[tuple[str, str]],
    witnesses: Sequence[WitnessConfig],
    now: dt.datetime | None = None,
) -> Break | None:
    """A purged tenant's tombstone against its witnesses, as ``stamps_verify``
    checks a head: each stored ``(signer, line)`` of a configured witness must be
    its cosignature of the tombstone (``forged cosignature``; ``replayed
    cosignature`` for its cosignature of one of the log's heads, or one dated
    before the tombstone was signed), and a tombstone signed longer ago than the
    grace must carry every witness's (``not witnessed``). Call in the tenant's
    scope, after ``verify_log.tombstone_verify`` found the tombstone valid."""
    now = now or dt.datetime.now(dt.UTC)
    heads = list(TreeHead.objects.filter(tenant_id=tenant_id).order_by("size"))
    others = {head.pk: head_body(head) for head in heads}
    # Not a stored head: a stand-in with the tombstone's size and time.
    tombstone = TreeHead(tenant_id=tenant_id, size=size, note=note, signed_at=signed_at)
    body = note.rpartition("\n\n")[0] + "\n"
    cosigned = set()
    for signer, line in stamps:
        config = next((w for w in witnesses if w.name == signer), None)
        if config is None:
            continue
        broken = cosignature_check(
            line, head=tombstone, body=body, config=config, others=others
        )
        if broken is not None:
            detail = broken.detail.replace(f"tree head of {size}", "the tombstone", 1)
            return Break(broken.kind, PLACE, detail)
        cosigned.add(config.name)
    if signed_at < now - WITNESS_GRACE:
        for config in witnesses:
            if config.name not in cosigned:
                detail = (
                    f"the tombstone of size {size} (signed "
                    f"{signed_at:%Y-%m-%dT%H:%M:%SZ}) has no cosignature by witness "
                    f"{config.name}"
                )
                return Break(NOT_WITNESSED, PLACE, detail)
    return None


def witness_state_verify(
    *,
    tenant_id: uuid.UUID,
    tree: merkle.Tree,
    config: WitnessConfig,
    client: httpx.Client,
) -> Break | str | None:
    """The witness's own latest checkpoint for this tenant (its monitoring
    endpoint) against the log: the log must hold it (``deleted`` when shorter,
    ``forked`` when its first leaves give another root). Returns a note (str)
    when the witness could not be asked."""
    from .verify import DELETED
    from .verify_log import FORKED

    origin = tlog.origin_of(tenant_id)
    url = f"{config.url}/{witness.origin_hash(origin)}/checkpoint"
    try:
        response = client.get(url, timeout=settings.PORTAL_AUDIT_WITNESS_TIMEOUT_S)
    except httpx.HTTPError as error:
        return f"witness {config.name} not asked: {error}"
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        return f"witness {config.name} answered {response.status_code}"
    note = response.text
    body = note.rpartition("\n\n")[0] + "\n"
    try:
        checkpoint = tlog.checkpoint_parse(body)
    except tlog.NoteError as error:
        return f"witness {config.name}: {error}"
    if not any(
        _opens(cosig.line, body, config) for cosig in witness.cosignature_lines(note)
    ):
        return f"witness {config.name}'s checkpoint carries no cosignature of its key"
    where = f"witness {config.name} cosigned a head of {checkpoint.size}"
    if checkpoint.size > len(tree):
        return Break(DELETED, PLACE, f"{where}; the log has {len(tree)} leaves")
    if tree.root(checkpoint.size) != checkpoint.root:
        return Break(FORKED, PLACE, f"{where} whose root the log does not give")
    return None


def _opens(line: str, body: str, config: WitnessConfig) -> bool:
    try:
        witness.cosignature_open(
            line, body=body, name=config.name, public=config.public
        )
    except witness.CosignatureError:
        return False
    return True


@dataclass
class StampsReport:
    """What ``tenant_stamps_verify`` found for one tenant."""

    broken: Break | None = None
    cosigned: int = 0  # heads with every witness's cosignature
    timestamped: int = 0
    notes: tuple[str, ...] = ()


def tenant_stamps_verify(
    *,
    tenant_id: uuid.UUID,
    witnesses: Sequence[WitnessConfig],
    tsa_roots: Sequence[timestamp.Certificate],
    ask_witnesses: bool = True,
) -> StampsReport:
    """``stamps_verify`` over the tenant's heads, then (``ask_witnesses``) each
    witness's own latest checkpoint for the tenant against the log. Call in the
    tenant's scope, after ``verify_log.log_verify`` found the log intact."""
    heads = list(TreeHead.objects.filter(tenant_id=tenant_id).order_by("size"))
    broken = stamps_verify(
        tenant_id=tenant_id, heads=heads, witnesses=witnesses, tsa_roots=tsa_roots
    )
    rows = HeadStamp.objects.filter(tenant_id=tenant_id)
    signers = {w.name for w in witnesses}
    by_head: dict[uuid.UUID, set[str]] = {}
    timestamped = set()
    for head_id, kind, signer in rows.values_list("tree_head_id", "kind", "signer"):
        if kind == HeadStamp.Kind.RFC3161:
            timestamped.add(head_id)
        elif signer in signers:
            by_head.setdefault(head_id, set()).add(signer)
    report = StampsReport(
        broken=broken,
        cosigned=sum(1 for names in by_head.values() if names >= signers)
        if signers
        else 0,
        timestamped=len(timestamped),
    )
    asked = [w for w in witnesses if w.url]
    if broken is not None or not ask_witnesses or not asked:
        return report
    tree = tlog.log_tree(tenant_id=tenant_id)
    notes = []
    with httpx.Client() as client:
        for config in asked:
            found = witness_state_verify(
                tenant_id=tenant_id, tree=tree, config=config, client=client
            )
            if isinstance(found, Break):
                report.broken = found
                return report
            if found:
                notes.append(found)
    report.notes = tuple(notes)
    return report
