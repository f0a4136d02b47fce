"""Tree heads as C2SP ``tlog-checkpoint`` notes, signed as C2SP ``signed-note``.

A tenant's transparency log (docs/audit-integrity.md, "Transparency log") is an
RFC 9162 Merkle tree (audit/merkle.py) over its events' chain hashes in log order.
Its heads are checkpoints in the format stock tools read
(``c2sp.org/tlog-checkpoint``)::

    <origin>
    <tree size, decimal>
    <root hash, standard base64>

    — <key name> <base64(4-byte key hash || 64-byte Ed25519 signature)>

The signature covers the body (the text up to and including its last newline). The
key hash is the first 4 bytes of ``SHA-256(key name || 0x0A || 0x01 || public key)``
(``c2sp.org/signed-note``, algorithm 0x01 = Ed25519); the key name is the origin.
Witnesses add their own signature lines to the same note.

This module holds the format (building a body, reading one, checking a note's
signature with a public key) and the log itself: ``log_append`` gives positions
to the events no entry names yet, ``log_tree`` reads a tenant's leaves back.
Signing is ``audit.checkpoints`` (the one place that holds the private key).
``tests/unit/audit/test_tlog_note.py`` checks the format against
golang.org/x/mod/sumdb/note's known-good note.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection

from portal import db as portal_db

from . import merkle

ALG_ED25519: Final = b"\x01"
# An event that a checkpoint run could not see yet: its transaction began (its
# created_at) before the run but committed after it. The log looks this far back
# for events it has not placed; verify_audit reports older unplaced or unsigned
# events.
IN_FLIGHT_GRACE: Final = dt.timedelta(minutes=10)
# The origin line of a tenant's log, and its signing key's name in the notes.
ORIGIN_PREFIX: Final = "agent-governance-portal/tenants/"
SIGNATURE_DASH: Final = "\N{EM DASH} "
# The extension line a purged tenant's last head carries (docs/audit-integrity.md).
TOMBSTONE_LINE: Final = "tombstone: tenant purged"


class NoteError(ValueError):
    """A note that is malformed or not signed by the key given."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A parsed ``tlog-checkpoint`` body."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    @property
    def tombstone(self) -> bool:
        return TOMBSTONE_LINE in self.extensions


def checkpoint_body(
    *, origin: str, size: int, root: bytes, extensions: Iterable[str] = ()
) -> str:
    """The note text of a tree head; every line ends with a newline."""
    if not origin or "\n" in origin or size < 0 or len(root) != 32:
        raise NoteError("not a checkpoint")
    lines = [origin, str(size), base64.b64encode(root).decode("ascii"), *extensions]
    return "".join(f"{line}\n" for line in lines)


def checkpoint_parse(body: str) -> Checkpoint:
    """Read a checkpoint body (the note's text, without signatures).

    Raises:
        NoteError: not three lines of origin, decimal size and a 32-byte root.
    """
    if not body.endswith("\n"):
        raise NoteError("a checkpoint ends with a newline")
    lines = body[:-1].split("\n")
    if len(lines) < 3 or any(not line for line in lines):
        raise NoteError("a checkpoint has an origin, a size and a root hash")
    origin, size, root, *extensions = lines
    if not size.isascii() or not size.isdigit() or (size != "0" and size[0] == "0"):
        raise NoteError("the tree size is not a decimal number")
    try:
        root_bytes = base64.b64decode(root, validate=True)
    except binascii.Error:
        raise NoteError("the root hash is not base64") from None
    if len(root_bytes) != 32:
        raise NoteError("the root hash is not 32 bytes")
    return Checkpoint(
        origin=origin, size=int(size), root=root_bytes, extensions=tuple(extensions)
    )


def raw_public(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )


def key_hash(name: str, public: Ed25519PublicKey) -> bytes:
    """The 4-byte key hash of the signed-note spec for an Ed25519 key."""
    data = name.encode("utf-8") + b"\n" + ALG_ED25519 + raw_public(public)
    return hashlib.sha256(data).digest()[:4]


def verifier_key(name: str, public: Ed25519PublicKey) -> str:
    """The ``<name>+<hex key hash>+<base64(0x01 || key)>`` text stock tools take."""
    encoded = base64.b64encode(ALG_ED25519 + raw_public(public)).decode("ascii")
    return f"{name}+{key_hash(name, public).hex()}+{encoded}"


def signature_line(name: str, public: Ed25519PublicKey, signature: bytes) -> str:
    blob = base64.b64encode(key_hash(name, public) + signature).decode("ascii")
    return f"{SIGNATURE_DASH}{name} {blob}\n"


def note_open(note: str, *, name: str, public: Ed25519PublicKey) -> str:
    """The body of ``note`` when a signature line by ``name`` with ``public`` verifies.

    Other signature lines (a witness's cosignature) are left unchecked.

    Raises:
        NoteError: malformed, no line for this key (name and key hash), or a line for
            it whose signature does not verify.
    """
    body, sep, signatures = note.rpartition("\n\n")
    if not sep or not body or not signatures.endswith("\n"):
        raise NoteError("malformed note")
    body += "\n"
    wanted = key_hash(name, public)
    found = False
    for line in signatures[:-1].split("\n"):
        if not line.startswith(SIGNATURE_DASH):
            raise NoteError("malformed note")
        signer, _, blob = line[len(SIGNATURE_DASH) :].partition(" ")
        try:
            raw = base64.b64decode(blob, validate=True)
        except binascii.Error:
            raise NoteError("malformed note") from None
        if len(raw) < 5:
            raise NoteError("malformed note")
        if signer != name or raw[:4] != wanted:
            continue
        try:
            public.verify(raw[4:], body.encode("utf-8"))
        except InvalidSignature:
            raise NoteError(f"invalid signature for key {name}") from None
        found = True
    if not found:
        raise NoteError(f"no signature by key {name}")
    return body


def origin_of(tenant_id: uuid.UUID) -> str:
    return f"{ORIGIN_PREFIX}{tenant_id}"


# The events no log entry names yet, in id order (UUIDv7: the order they were
# made in), placed after the log's last position. Only events made since
# ``since`` are looked at: an event whose transaction stays open longer than the
# grace before that is left out, and verify_audit reports it (``not logged``).
_LOG_APPEND: Final = """
WITH last AS (
    SELECT coalesce(max(position), -1) AS position FROM audit_logentry
    WHERE tenant_id = %(tenant_id)s
), fresh AS (
    SELECT e.id, e.hash FROM audit_event e
    WHERE e.tenant_id = %(tenant_id)s AND e.chain_seq IS NOT NULL
      AND e.created_at >= %(since)s
      AND NOT EXISTS (SELECT 1 FROM audit_logentry l
                      WHERE l.tenant_id = %(tenant_id)s AND l.event_id = e.id)
)
INSERT INTO audit_logentry (id, tenant_id, position, event_id, event_hash)
SELECT gen_random_uuid(), %(tenant_id)s,
    last.position + row_number() OVER (ORDER BY fresh.id), fresh.id, fresh.hash
FROM fresh CROSS JOIN last
RETURNING position, event_hash
"""


def log_append(*, tenant_id: uuid.UUID, since: dt.datetime) -> list[bytes]:
    """Give the next positions of a tenant's log to its events that have none.

    Call inside the checkpoint run's transaction, which holds the tenant's lock
    (one writer per log). Returns the new leaves' event hashes in log order.
    """
    portal_db.require_transaction()
    with connection.cursor() as cursor:
        cursor.execute(_LOG_APPEND, {"tenant_id": tenant_id, "since": since})
        rows = sorted(cursor.fetchall())
    return [bytes.fromhex(event_hash) for _, event_hash in rows]


def log_tree(*, tenant_id: uuid.UUID, size: int | None = None) -> merkle.Tree:
    """The tenant's log as a Merkle tree, its leaves read in position order.

    Cost: one index scan and 32 bytes per leaf in memory (docs/audit-integrity.md).
    Raises ``ValueError`` when a position is missing (the log was cut).
    """
    sql = "SELECT position, event_hash FROM audit_logentry WHERE tenant_id = %s"
    params: list[uuid.UUID | int] = [tenant_id]
    if size is not None:
        sql += " AND position < %s"
        params.append(size)
    leaves: list[bytes] = []
    with connection.cursor() as cursor:
        cursor.execute(sql + " ORDER BY position", params)
        for position, event_hash in cursor:
            if position != len(leaves):
                raise ValueError(f"the log has no leaf {len(leaves)}")
            leaves.append(merkle.leaf_hash(bytes.fromhex(event_hash)))
    return merkle.Tree(leaves)
