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

This module is the format only: building a body, reading one, and checking a
note's signature with a public key. Signing is ``audit.checkpoints`` (the one
place that holds the private key). ``tests/unit/audit/test_tlog_note.py`` checks
the format against golang.org/x/mod/sumdb/note's known-good note.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

ALG_ED25519: Final = b"\x01"
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
