"""Signed checkpoints of the event chains (docs/audit-integrity.md).

A checkpoint row says "this chain's head was event N with hash H, and the tenant had
C chained events" and carries an Ed25519 signature over exactly that. The private key
lives outside the database (``PORTAL_AUDIT_SIGNING_KEY_FILE`` or
``PORTAL_AUDIT_SIGNING_KEY``), so someone who can write the database can cut or
rewrite events but cannot make a matching checkpoint.

This module is the one signer: only ``signing_key`` loads the private key, and it
refuses to in the web server's process (``portal.process``), so the key lives where
the Celery workers (the checkpoint jobs) and management commands run. The web
publishes the public half from ``PORTAL_AUDIT_PUBLIC_KEY_FILE`` (``public_key``)
and asks a worker for a checkpoint (``audit.evidence``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from django.conf import settings
from django.db import connection, transaction

from portal import process, scope
from portal.models import Tenant

from . import chain, merkle, tlog
from .exceptions import (
    PublicKeyMismatch,
    PublicKeyMissing,
    SigningKeyInWeb,
    SigningKeyMissing,
)
from .models import Checkpoint, TreeHead

SIGNATURE_FORMAT_VERSION: Final = 1


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey
    key_id: str

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()


def key_id_of(public: Ed25519PublicKey) -> str:
    """16 hex digits of the SHA-256 of the raw public key: names the key in rows."""
    raw = public.public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_pem(public: Ed25519PublicKey) -> str:
    return public.public_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PublicFormat.SubjectPublicKeyInfo,
    ).decode("ascii")


def _load_private(pem: bytes) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyMissing("The audit signing key is not an Ed25519 key.")
    return key


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write a file that must not exist yet; when another process made it first,
    theirs stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def _development_key(path: Path) -> bytes:
    """The development key file, made on first use (0600, never overwritten)."""
    if not path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
        _write_new(path, pem, 0o600)
    return path.read_bytes()


def _load_public(pem: bytes) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError:
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise PublicKeyMissing("The audit public key is not an Ed25519 public key.")
    return key


def _public_key_file() -> Path | None:
    """The published key's file; None: production without one configured."""
    if settings.PORTAL_AUDIT_PUBLIC_KEY_FILE:
        return Path(settings.PORTAL_AUDIT_PUBLIC_KEY_FILE)
    if settings.PRODUCTION:
        return None
    return Path(settings.PORTAL_AUDIT_DEV_PUBLIC_KEY_FILE)


def _same_key(pem: bytes, public: Ed25519PublicKey) -> bool:
    try:
        return key_id_of(_load_public(pem)) == key_id_of(public)
    except PublicKeyMissing:
        return False


def _public_key_check(private: Ed25519PrivateKey, *, development: bool) -> None:
    """Check the published public key against the signing key. The development
    key's half is written beside it when missing or stale (atomically: every
    process writes the same bytes).

    Raises:
        PublicKeyMismatch: ``PORTAL_AUDIT_PUBLIC_KEY_FILE`` is another pair's, or
            unreadable.
    """
    public = private.public_key()
    if settings.PORTAL_AUDIT_PUBLIC_KEY_FILE:
        path = Path(settings.PORTAL_AUDIT_PUBLIC_KEY_FILE)
        try:
            published = path.read_bytes()
        except OSError:
            raise PublicKeyMismatch(path=str(path)) from None
        if not _same_key(published, public):
            raise PublicKeyMismatch(path=str(path))
        return
    if not development:
        return  # nothing published to compare with (a production web refuses this)
    path = Path(settings.PORTAL_AUDIT_DEV_PUBLIC_KEY_FILE)
    if path.exists() and _same_key(path.read_bytes(), public):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_bytes(public_key_pem(public).encode("ascii"))
    os.replace(scratch, path)


def signing_key() -> SigningKey:
    """The configured signing key: the environment's PEM, its file, or (development
    and tests only) var/audit-signing-key.pem, generated on first use. Never in
    the web server's process.

    Guarantee: the key returned is the one ``public_key()`` publishes when
    ``PORTAL_AUDIT_PUBLIC_KEY_FILE`` is set; the development key writes its public
    half to ``PORTAL_AUDIT_DEV_PUBLIC_KEY_FILE``.

    Raises:
        SigningKeyInWeb: called in the web server's process (``portal.process``).
        SigningKeyMissing: production without a configured key, or not Ed25519.
        PublicKeyMismatch: ``PORTAL_AUDIT_PUBLIC_KEY_FILE`` is another pair's.
    """
    if process.is_web():
        raise SigningKeyInWeb()
    if settings.PORTAL_AUDIT_SIGNING_KEY:
        pem = settings.PORTAL_AUDIT_SIGNING_KEY.encode("ascii")
    elif settings.PORTAL_AUDIT_SIGNING_KEY_FILE:
        pem = Path(settings.PORTAL_AUDIT_SIGNING_KEY_FILE).read_bytes()
    elif settings.PRODUCTION:
        raise SigningKeyMissing()
    else:
        pem = _development_key(Path(settings.PORTAL_AUDIT_DEV_SIGNING_KEY_FILE))
    private = _load_private(pem)
    development = not (
        settings.PORTAL_AUDIT_SIGNING_KEY or settings.PORTAL_AUDIT_SIGNING_KEY_FILE
    )
    _public_key_check(private, development=development)
    return SigningKey(private=private, key_id=key_id_of(private.public_key()))


def public_key() -> tuple[str, Ed25519PublicKey]:
    """The published public key and its key id: ``PORTAL_AUDIT_PUBLIC_KEY_FILE``,
    or outside production the file the development signer writes beside its key.
    Reads no private key, so the web serves it.

    Raises:
        PublicKeyMissing: no such file (yet), or it holds no Ed25519 public key.
    """
    path = _public_key_file()
    try:
        pem = path.read_bytes() if path is not None else None
    except FileNotFoundError:
        pem = None
    if pem is None:
        raise PublicKeyMissing()
    public = _load_public(pem)
    return key_id_of(public), public


def signed_at_text(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def signed_message(
    *,
    tenant_id: uuid.UUID | str,
    task_id: uuid.UUID | str | None,
    head_seq: int,
    head_event_id: uuid.UUID | str,
    head_hash: str,
    event_count: int,
    signed_at: dt.datetime,
    key_id: str,
) -> bytes:
    """The bytes a checkpoint's signature covers: RFC 8785 JSON of its columns."""
    return chain.canonical(
        {
            "v": SIGNATURE_FORMAT_VERSION,
            "tenant_id": str(tenant_id),
            "task_id": str(task_id) if task_id is not None else None,
            "head_seq": head_seq,
            "head_event_id": str(head_event_id),
            "head_hash": head_hash,
            "event_count": event_count,
            "signed_at": signed_at_text(signed_at),
            "key_id": key_id,
        }
    )


def checkpoint_message(checkpoint: Checkpoint) -> bytes:
    return signed_message(
        tenant_id=checkpoint.tenant_id,
        task_id=checkpoint.task_id,
        head_seq=checkpoint.head_seq,
        head_event_id=checkpoint.head_event_id,
        head_hash=checkpoint.head_hash,
        event_count=checkpoint.event_count,
        signed_at=checkpoint.signed_at,
        key_id=checkpoint.key_id,
    )


def signature_valid(
    checkpoint: Checkpoint, *, public_keys: Mapping[str, Ed25519PublicKey]
) -> bool:
    """True when a known key signed exactly this checkpoint's columns."""
    public = public_keys.get(checkpoint.key_id)
    if public is None:
        return False
    try:
        public.verify(
            bytes.fromhex(checkpoint.signature), checkpoint_message(checkpoint)
        )
    except (InvalidSignature, ValueError):
        return False
    return True


# The heads that moved since each chain's last checkpoint and the tenant's count of
# chained events, in one statement: one snapshot, so the count and the heads agree.
_MOVED_HEADS: Final = """
WITH heads AS (
    SELECT DISTINCT ON (task_id) task_id, chain_seq, id, hash FROM audit_event
    WHERE tenant_id = %(tenant_id)s AND chain_seq IS NOT NULL
    ORDER BY task_id, chain_seq DESC
), checkpointed AS (
    SELECT DISTINCT ON (task_id) task_id, head_seq, head_hash FROM audit_checkpoint
    WHERE tenant_id = %(tenant_id)s
    ORDER BY task_id, signed_at DESC, head_seq DESC
), total AS (
    -- Purged events count too: the signed count is every event the chains ever
    -- held, which is what the checkpoints' head numbers add up to.
    SELECT ((SELECT count(*) FROM audit_event
            WHERE tenant_id = %(tenant_id)s AND chain_seq IS NOT NULL)
        + (SELECT coalesce(sum(events), 0) FROM audit_retentionpurge
           WHERE tenant_id = %(tenant_id)s))::bigint AS n
)
SELECT heads.task_id, heads.chain_seq, heads.id, heads.hash, total.n,
    clock_timestamp()
FROM heads CROSS JOIN total
LEFT JOIN checkpointed ON checkpointed.task_id IS NOT DISTINCT FROM heads.task_id
WHERE checkpointed.head_seq IS NULL
    OR (heads.chain_seq > checkpointed.head_seq AND (
        -- the signed head is still there, unchanged: the chain only grew
        EXISTS (SELECT 1 FROM audit_event signed
            WHERE signed.tenant_id = %(tenant_id)s
            AND signed.task_id IS NOT DISTINCT FROM heads.task_id
            AND signed.chain_seq = checkpointed.head_seq
            AND signed.hash = checkpointed.head_hash)
        -- or retention purged past it, through the owner's path (an anchor)
        OR EXISTS (SELECT 1 FROM audit_retentionanchor anchor
            WHERE anchor.tenant_id = %(tenant_id)s
            AND anchor.task_id IS NOT DISTINCT FROM heads.task_id
            AND anchor.seq >= checkpointed.head_seq)))
"""


@transaction.atomic(durable=True)
def tenant_checkpoint(*, tenant_id: uuid.UUID, key: SigningKey) -> int:
    """Sign every chain head of one tenant that grew since its last checkpoint.

    A head is signed only when the chain extends its last signed head (that event is
    still there with the signed hash, or retention purged past it): a chain cut
    below, or altered at, its signed head is never signed over, so ``verify_audit``
    keeps reporting the break instead of a fresh checkpoint hiding it.

    The same run gives the tenant's new events their places in its transparency
    log and signs the new tree head (``tree_head_sign``).

    Guarantee: one run per tenant at a time (a second one returns 0 at once); all
    rows of a run carry the same snapshot's event count and ``signed_at``. Idempotent:
    a run with nothing new writes nothing. Returns the number of checkpoint rows
    written.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"audit.checkpoint:{tenant_id}"],
        )
        if not cursor.fetchone()[0]:
            return 0
        cursor.execute(_MOVED_HEADS, {"tenant_id": tenant_id})
        rows = cursor.fetchall()
    checkpoints = []
    for task_id, head_seq, head_event_id, head_hash, count, signed_at in rows:
        fields: dict[str, Any] = {
            "tenant_id": tenant_id,
            "task_id": task_id,
            "head_seq": head_seq,
            "head_event_id": head_event_id,
            "head_hash": head_hash,
            "event_count": count,
            "signed_at": signed_at,
            "key_id": key.key_id,
        }
        signature = key.private.sign(signed_message(**fields)).hex()
        checkpoints.append(Checkpoint(signature=signature, **fields))
    Checkpoint.objects.bulk_create(checkpoints)
    tree_head_sign(tenant_id=tenant_id, key=key)
    return len(checkpoints)


def tree_note_sign(*, body: str, key: SigningKey) -> str:
    """A C2SP signed note of ``body`` (a checkpoint body): the body, a blank line
    and this key's signature line, named by the body's origin (audit/tlog.py)."""
    origin = tlog.checkpoint_parse(body).origin
    signature = key.private.sign(body.encode("utf-8"))
    return f"{body}\n{tlog.signature_line(origin, key.public, signature)}"


def tree_head_sign(*, tenant_id: uuid.UUID, key: SigningKey) -> TreeHead | None:
    """Append the tenant's unplaced events to its log and sign the new head.

    A helper of ``tenant_checkpoint`` (its transaction and tenant lock). The head
    extends the previous one by construction: the new leaves are added to the
    previous head's compact range. Returns the new head, or None with nothing new.
    """
    previous = TreeHead.objects.filter(tenant_id=tenant_id).order_by("-size").first()
    since = (
        previous.signed_at - tlog.IN_FLIGHT_GRACE
        if previous is not None
        else dt.datetime.min.replace(tzinfo=dt.UTC)
    )
    leaves = tlog.log_append(tenant_id=tenant_id, since=since)
    if not leaves:
        return None
    peaks = [bytes.fromhex(p) for p in previous.peaks.split()] if previous else []
    peaks, size = merkle.compact_extend(
        peaks, previous.size if previous else 0, map(merkle.leaf_hash, leaves)
    )
    root = merkle.compact_root(peaks)
    body = tlog.checkpoint_body(origin=tlog.origin_of(tenant_id), size=size, root=root)
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        signed_at = cursor.fetchone()[0]
    return TreeHead.objects.create(
        tenant_id=tenant_id,
        size=size,
        root_hash=root.hex(),
        peaks=" ".join(peak.hex() for peak in peaks),
        note=tree_note_sign(body=body, key=key),
        signed_at=signed_at,
        key_id=key.key_id,
    )


def tenant_checkpoint_scoped(
    *, tenant_id: uuid.UUID, key: SigningKey | None = None
) -> int:
    """``tenant_checkpoint`` in the tenant's own scope (row-level security), with
    the configured key unless one is given: what a worker runs for one tenant.

    Raises:
        SigningKeyInWeb, SigningKeyMissing, PublicKeyMismatch: see ``signing_key``.
    """
    key = key or signing_key()
    with scope.tenant_scope([tenant_id]):
        written = tenant_checkpoint(tenant_id=tenant_id, key=key)
    # Committed: the newest head to the witnesses, the TSA and the export (HTTP,
    # so never inside the run's transaction; retried by every later run).
    from . import witness_client  # it imports the verifier, which imports this

    if witness_client.vouching_configured():
        witness_client.head_vouch(tenant_id=tenant_id)
    return written


def unscoped_checkpoint_all(*, key: SigningKey | None = None) -> dict[str, int]:
    """Checkpoint every tenant that has events, one transaction per tenant, each in
    its own tenant scope (row-level security).

    Returns rows written per tenant id (tenants with nothing new are left out).
    """
    key = key or signing_key()
    tenant_ids = list(Tenant.objects.order_by("pk").values_list("pk", flat=True))
    written: dict[str, int] = {}
    for tenant_id in tenant_ids:
        rows = tenant_checkpoint_scoped(tenant_id=tenant_id, key=key)
        if rows:
            written[str(tenant_id)] = rows
    return written
