#!/usr/bin/env python3
"""Verify a task's evidence bundle offline, with the portal's published public key.

    python3 tools/verify_bundle.py BUNDLE.json --public-key KEY [--public-key KEY]

``KEY`` is a PEM file with the Ed25519 public key, or the JSON answer of
``GET /api/v1/audit/public-key`` saved to a file, or the PEM text itself. Exit 0 when
the bundle is intact; 1 with the first failure and its kind; 2 when the command
line or a key is unusable. Needs Python 3.11+ and ``cryptography``, nothing else:
no Django, no database, no network (docs/audit-integrity.md, "Evidence bundles").

What is checked, in this order, stopping at the first failure:

1. ``forged checkpoint``: the checkpoint's Ed25519 signature over its fields does
   not verify with a given key (changed fields, another key, an unknown key id);
2. the chain, event by event: ``inserted`` (an event of another chain, one with no
   chain link, two in one place, one spliced in), ``altered`` (the content and the
   previous hash do not give the stored hash), ``reordered`` (a link to a later
   event, numbers that disagree with the links), ``deleted`` (a link to a missing
   event);
3. the checkpoint against the chain: ``deleted`` (the chain ends before the signed
   head: a cut tail), ``altered`` (the event at the signed head is not the signed
   one), ``not covered`` (no checkpoint, one of another chain, or events after the
   signed head that nobody signed);
4. ``unproven anchor``: a chain that retention purged starts after an anchor
   (``chain.anchor``: the last purged event's number and hash). Everything after the
   anchor is checked as above, but that the anchor stands for a recorded purge (its
   ``audit.purged`` tombstone in the tenant's chain) only ``manage.py verify_audit``
   can prove, so such a bundle is never reported intact.
5. the sections made from the chain's events: ``altered`` when ``chain.length``,
   ``chain.head_hash`` or ``takeover_decisions`` do not say what the events say;
6. the transparency log (``log``, when the bundle has one): ``forged checkpoint``
   when no given key signed its tree head (a C2SP checkpoint note for the tenant's
   origin), ``forged proof`` when an event's RFC 9162 inclusion proof does not lead
   to the signed root, ``inserted`` for a proof of no event of the chain.
7. with ``--witness-key VKEY`` (repeatable): the tree head must carry each
   witness's C2SP ``cosignature/v1`` line: ``not witnessed`` without one,
   ``forged cosignature`` when no line of its key verifies on the head,
   ``replayed cosignature`` when the line is dated before the signed checkpoint
   it would vouch for (a cosignature of an earlier head);
8. with ``--tsa-root PEM`` (needs ``rfc3161-client``): an RFC 3161 token over the
   tree head's body that chains to the root: ``not timestamped``, ``timestamp
   for another head`` (its imprint is not SHA-256 of this head's body), ``forged
   timestamp`` (it does not verify to the root).

After step 6, from bundle version 3, every other section: the export record
(``export``: the ``audit.exported`` event the export appended, listing each
section's SHA-256) must hash as an event, be this task's, and be included in the
signed tree head (``forged proof`` otherwise); each section's digest must be the
one it lists (``altered``/``deleted`` **in section NAME**). A version 2 bundle has
no export record: its other sections (the task row beyond its id, operations,
receipts, escalations, the tenant, the export's own fields, coverage) no signature
covers, and the output names each of them as not checked.

Events in chain format v2 (content ``"v": 2``) hash the payload's digest
(``payload_digest``: SHA-256 of its RFC 8785 JSON, integers beyond 2^53-1 as decimal
strings) instead of the payload; where the event still carries its ``payload`` it
must match the digest (``altered`` otherwise); a dropped payload is null.

A bundle that is not the expected JSON at all is ``malformed``. The walk mirrors
``manage.py verify_audit``'s (audit/verify.py) on purpose: this file must stand
alone, so it cannot import it; a test pins the names and formats they share. The
canonical JSON
here is a second, standard-library implementation of RFC 8785 that must agree byte
for byte with the ``rfc8785`` package the portal hashes with (audit/chain.py);
tests/unit/audit/test_verify_bundle_canonical.py compares the two.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

BUNDLE_FORMAT: Final = "agent-governance-portal/evidence-bundle"
BUNDLE_VERSIONS: Final = frozenset({1, 2, 3})
# From 3 every section but log and export is bound by the export record.
BOUND_FROM_VERSION: Final = 3
UNBOUND_SECTIONS: Final = frozenset({"log", "export"})  # tasks/evidence.py's
EXPORT_CODE: Final = "audit.exported"
CHAIN_FORMAT_VERSIONS: Final = frozenset({1, 2})  # the events' "v" (audit/chain.py)
CHAIN_FORMAT_V2: Final = 2  # the payload's digest is hashed, not the payload
SIGNATURE_FORMAT_VERSIONS: Final = frozenset({1})  # the checkpoints' "v"
GENESIS: Final = "0" * 64
# The checkpoint fields the signature covers (audit/checkpoints.py signed_message).
SIGNED_FIELDS: Final = (
    "v",
    "tenant_id",
    "task_id",
    "head_seq",
    "head_event_id",
    "head_hash",
    "event_count",
    "signed_at",
    "key_id",
)

# The kinds, named as manage.py verify_audit names them (audit/verify.py).
ALTERED: Final = "altered"
DELETED: Final = "deleted"
INSERTED: Final = "inserted"
REORDERED: Final = "reordered"
FORGED_CHECKPOINT: Final = "forged checkpoint"
NOT_COVERED: Final = "not covered"
MALFORMED: Final = "malformed"
UNPROVEN_ANCHOR: Final = "unproven anchor"
FORGED_PROOF: Final = "forged proof"  # an inclusion proof that does not verify

# The transparency log (audit/tlog.py): a tenant's origin, and the takeover
# decisions' event codes (tasks/evidence.py DECISION_CODES), which a test pins.
LOG_ORIGIN_PREFIX: Final = "agent-governance-portal/tenants/"
DECISION_CODES: Final = frozenset(
    {
        "task.human_claimed",
        "task.human_released",
        "task.resolved",
        "operation.approved",
        "operation.fields_edited",
    }
)
# What the checks below cover; every other member of the bundle (or of its chain)
# is named in the output as not checked.
CHECKED_SECTIONS: Final = frozenset(
    {"format", "version", "chain", "checkpoint", "log", "takeover_decisions"}
)
CHECKED_CHAIN_MEMBERS: Final = frozenset(
    {"tenant_id", "task_id", "anchor", "events", "length", "head_hash"}
)

EXIT_INTACT: Final = 0
EXIT_BROKEN: Final = 1
EXIT_USAGE: Final = 2


# --- RFC 8785 canonical JSON ---------------------------------------------------------


class CanonicalizationError(ValueError):
    """A value RFC 8785 cannot represent (NaN, infinity, a huge integer, a lone
    surrogate, a non-string key)."""


# An integer beyond this is not exact as an IEEE 754 double: refused, as rfc8785
# refuses it (the portal hashes such integers as strings).
_MAX_SAFE_INTEGER: Final = 2**53 - 1
_SHORT_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _string(text: str) -> str:
    """RFC 8785 3.2.2.2: quotes, backslash and controls escaped, the rest as is."""
    out = ['"']
    for char in text:
        escaped = _SHORT_ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _number(value: float) -> str:
    """ECMAScript's Number::toString of a double (RFC 8785 3.2.2.3).

    ``repr`` gives the shortest digits that round-trip, as ECMAScript requires;
    this places the decimal point (or the exponent) the way ECMAScript does.
    """
    if math.isnan(value) or math.isinf(value):
        raise CanonicalizationError(f"{value!r} has no JSON form")
    if value == 0:
        return "0"  # -0 too
    if value < 0:
        return "-" + _number(-value)
    mantissa, _, exponent_text = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    # value = 0.<digits> x 10^point, once leading zeros are dropped from digits
    point = len(whole) + int(exponent_text or "0")
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        return digits + "0" * (point - k)
    if 0 < point <= 21:
        return f"{digits[:point]}.{digits[point:]}"
    if -6 < point <= 0:
        return "0." + "0" * -point + digits
    exponent = point - 1
    sign = "+" if exponent >= 0 else "-"
    head = digits[0] + (f".{digits[1:]}" if k > 1 else "")
    return f"{head}e{sign}{abs(exponent)}"


def _canonical_text(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) > _MAX_SAFE_INTEGER:
            raise CanonicalizationError(f"{value} is beyond the exact integers")
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise CanonicalizationError("object keys must be strings")
        # RFC 8785 3.2.3: members sorted by their names' UTF-16 code units.
        names = sorted(
            value, key=lambda name: name.encode("utf-16-be", "surrogatepass")
        )
        members = (f"{_string(name)}:{_canonical_text(value[name])}" for name in names)
        return "{" + ",".join(members) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_canonical_text(item) for item in value) + "]"
    raise CanonicalizationError(f"{type(value).__name__} is not JSON")


def canonical(value: Any) -> bytes:
    """The RFC 8785 canonical JSON of ``value``, UTF-8."""
    try:
        return _canonical_text(value).encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate
        raise CanonicalizationError("text is not valid Unicode") from error


def hashable(value: Any) -> Any:
    """``value`` with integers beyond the exact range as decimal strings, the rule
    the portal hashes by (audit/chain.py)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) <= _MAX_SAFE_INTEGER else str(value)
    if isinstance(value, Mapping):
        return {key: hashable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [hashable(item) for item in value]
    return value


def payload_digest(payload: Any) -> str:
    """SHA-256 hex of the payload's canonical JSON: what a v2 content holds."""
    return hashlib.sha256(canonical(hashable(payload))).hexdigest()


def event_hash(*, prev_hash: str | None, content: Any) -> str:
    """SHA-256 of the previous hash (64 hex digits; zeros first) and the content."""
    digest = hashlib.sha256((prev_hash or GENESIS).encode("ascii"))
    digest.update(canonical(content))
    return digest.hexdigest()


# --- Keys ----------------------------------------------------------------------------


class UnusableKey(Exception):
    """A public key that cannot be used (exit 2)."""


def key_id_of(public: Ed25519PublicKey) -> str:
    """The first 16 hex digits of SHA-256 of the raw key, as checkpoints name it."""
    raw = public.public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    return hashlib.sha256(raw).hexdigest()[:16]


def load_public_key(source: str) -> tuple[str, Ed25519PublicKey]:
    """A key from a PEM file, the public-key endpoint's JSON saved to a file, or PEM
    text; returns (key id, key).

    Raises:
        UnusableKey: unreadable, not Ed25519, or its JSON names another key id.
    """
    text = source
    if not source.lstrip().startswith("-----BEGIN"):
        try:
            text = Path(source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UnusableKey(f"{source}: {error}") from error
    declared_id = None
    if text.lstrip().startswith("{"):
        try:
            answer = json.loads(text)
            text, declared_id = answer["public_key_pem"], answer.get("key_id")
        except (ValueError, KeyError, TypeError) as error:
            raise UnusableKey(
                f"{source}: not the public-key endpoint's JSON"
            ) from error
    try:
        public = serialization.load_pem_public_key(text.encode("ascii"))
    except (ValueError, TypeError, UnicodeEncodeError) as error:
        raise UnusableKey(f"{source}: not a PEM public key") from error
    if not isinstance(public, Ed25519PublicKey):
        raise UnusableKey(f"{source}: not an Ed25519 public key")
    key_id = key_id_of(public)
    if declared_id is not None and declared_id != key_id:
        raise UnusableKey(f"{source}: says key id {declared_id}, the key is {key_id}")
    return key_id, public


# --- Verification --------------------------------------------------------------------


class Failure(Exception):
    """The first place where the bundle and its signature disagree."""

    def __init__(
        self,
        kind: str,
        detail: str,
        seq: Any = None,
        event_id: Any = None,
        section: str | None = None,
    ) -> None:
        super().__init__(kind, detail)
        self.kind = kind
        self.detail = detail
        self.seq = seq
        self.event_id = event_id
        self.section = section  # the bundle's section where it failed, when known

    def __str__(self) -> str:
        where = f" in section {self.section}" if self.section else ""
        if self.seq is not None:
            where += f" at #{self.seq}"
        if self.event_id is not None:
            where += f" (event {self.event_id})"
        return f"{self.kind}{where}: {self.detail}"


@dataclass(frozen=True)
class Intact:
    """What a successful verification saw."""

    tenant_id: str
    task_id: str
    events: int
    head_hash: str
    signed_at: str
    key_id: str
    log_size: int | None = None  # the signed tree head's size; None: no log proof
    logged: int = 0  # events proven included in it
    not_checked: tuple[str, ...] = ()
    bound: tuple[str, ...] = ()  # sections the export record binds (version 3)
    export_event: str | None = None  # that record's event id
    witnessed: tuple[str, ...] = ()  # witnesses whose cosignature on it verified
    timestamps: int = 0  # RFC 3161 tokens on it, one verified to a given root

    def __str__(self) -> str:
        text = (
            f"intact: task {self.task_id} of tenant {self.tenant_id}: "
            f"{self.events} events, head {self.head_hash[:16]}…, signed "
            f"{self.signed_at} with key {self.key_id}"
        )
        if self.log_size is None:
            text += "\nlog: no signed tree head in the bundle (no inclusion proofs)"
        else:
            text += (
                f"\nlog: {self.logged} of the {self.events} events included in the "
                f"signed tree head of {self.log_size} events"
            )
        if self.bound:
            text += (
                f"\nbound: every section ({', '.join(self.bound)}) by the export "
                f"record, event {self.export_event}, in the signed tree head"
            )
        if self.witnessed:
            names = ", ".join(self.witnessed)
            text += f"\nwitnessed: the tree head is cosigned by {names}"
        if self.timestamps:
            text += "\ntimestamped: an RFC 3161 token over the tree head verifies"
        if self.not_checked:
            text += (
                "\nnot covered (no signature vouches for them, not checked): "
                + ", ".join(self.not_checked)
            )
        return text


def _malformed(detail: str) -> Failure:
    return Failure(MALFORMED, detail)


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _malformed(f"{what} is not a JSON object")
    return value


def _check_signature(
    checkpoint: Mapping[str, Any], public_keys: Mapping[str, Ed25519PublicKey]
) -> None:
    if checkpoint.get("v") not in SIGNATURE_FORMAT_VERSIONS:
        raise _malformed(f"checkpoint format {checkpoint.get('v')!r} is not known")
    missing = [name for name in (*SIGNED_FIELDS, "signature") if name not in checkpoint]
    if missing:
        raise _malformed(f"checkpoint lacks {', '.join(missing)}")
    seq, head = checkpoint["head_seq"], checkpoint["head_event_id"]
    public = public_keys.get(checkpoint["key_id"])
    if public is None:
        raise Failure(
            FORGED_CHECKPOINT,
            f"signed with key {checkpoint['key_id']!r}, not a key given",
            seq,
            head,
        )
    try:
        message = canonical({name: checkpoint[name] for name in SIGNED_FIELDS})
        public.verify(bytes.fromhex(checkpoint["signature"]), message)
    except (InvalidSignature, ValueError, TypeError):
        raise Failure(
            FORGED_CHECKPOINT, "the signature does not verify", seq, head
        ) from None


def _check_payload(row: Mapping[str, Any], content: Mapping[str, Any]) -> None:
    """A v2 event's payload, where it is still there, against its hashed digest."""
    seq, event_id = row.get("seq"), content.get("id")
    digest = content.get("payload_digest")
    if "payload" in content or not isinstance(digest, str):
        raise _malformed(f"event #{seq}: a v2 content holds payload_digest alone")
    payload = row.get("payload")
    if payload is None:
        return  # dropped by retention: the digest still stands for it
    try:
        matches = payload_digest(payload) == digest
    except (CanonicalizationError, UnicodeEncodeError, TypeError):
        matches = False
    if not matches:
        detail = "the payload does not match its digest"
        raise Failure(ALTERED, detail, seq, event_id)


def _anchor(chain: Mapping[str, Any]) -> Mapping[str, Any] | None:
    anchor = chain.get("anchor")
    if anchor is None:
        return None
    anchor = _object(anchor, "chain.anchor")
    seq, hash_ = anchor.get("seq"), anchor.get("hash")
    if not isinstance(seq, int) or seq < 1 or not isinstance(hash_, str):
        raise _malformed("chain.anchor needs a number (seq) and a hash")
    return anchor


def _check_chain(
    events: Sequence[Any],
    *,
    tenant_id: str,
    task_id: str,
    anchor: Mapping[str, Any] | None = None,
) -> list[Mapping[str, Any]]:
    """Each event's hash and link, in stored order (as audit/verify.py walks); a
    purged chain from its anchor on."""
    rows = [_object(event, f"event {i + 1}") for i, event in enumerate(events)]
    position = {
        row["hash"]: i for i, row in enumerate(rows) if isinstance(row.get("hash"), str)
    }
    expected_prev: str | None = anchor["hash"] if anchor else None
    base = anchor["seq"] if anchor else 0
    for i, row in enumerate(rows):
        content = row.get("content")
        seq = row.get("seq")
        event_id = content.get("id") if isinstance(content, Mapping) else None
        if not isinstance(content, Mapping) or (
            content.get("tenant_id"),
            content.get("task_id"),
        ) != (tenant_id, task_id):
            raise Failure(INSERTED, "not an event of this task's chain", seq, event_id)
        if content.get("v") not in CHAIN_FORMAT_VERSIONS:
            raise _malformed(f"event format {content.get('v')!r} is not known")
        if content.get("v") == CHAIN_FORMAT_V2:
            _check_payload(row, content)
        stored = row.get("hash")
        if not isinstance(seq, int) or not isinstance(stored, str):
            detail = "no chain link: not written by event_append"
            raise Failure(INSERTED, detail, seq, event_id)
        if i and seq == rows[i - 1].get("seq"):
            raise Failure(INSERTED, "two events in one place", seq, event_id)
        prev = row.get("prev_hash")
        try:
            recomputed = event_hash(prev_hash=prev, content=content)
        except (CanonicalizationError, UnicodeEncodeError, AttributeError, TypeError):
            recomputed = None
        if recomputed != stored:
            detail = "content does not match its hash"
            raise Failure(ALTERED, detail, seq, event_id)
        if prev != expected_prev:
            found = position.get(prev) if isinstance(prev, str) else None
            if found is not None and found > i:
                detail = "links to an event stored after it"
                raise Failure(REORDERED, detail, seq, event_id)
            if found is not None:
                detail = "the event before it is not the one it links to"
                raise Failure(INSERTED, detail, seq, event_id)
            raise Failure(DELETED, "the event it links to is missing", seq, event_id)
        if seq != base + i + 1:
            detail = f"numbered #{seq} but linked as #{base + i + 1}"
            raise Failure(REORDERED, detail, seq, event_id)
        expected_prev = stored
    return rows


def _check_coverage(
    rows: Sequence[Mapping[str, Any]],
    checkpoint: Mapping[str, Any] | None,
    *,
    tenant_id: str,
    task_id: str,
    base: int = 0,
) -> None:
    if checkpoint is None:
        raise Failure(NOT_COVERED, "the bundle has no checkpoint: nothing is signed")
    if (checkpoint["tenant_id"], checkpoint["task_id"]) != (tenant_id, task_id):
        raise Failure(NOT_COVERED, "the checkpoint signs another chain")
    signed = checkpoint["head_seq"]
    if not isinstance(signed, int) or signed < 1:
        raise _malformed(f"checkpoint head_seq {signed!r}")
    last = base + len(rows)  # the chain's numbers are base + 1 .. last
    if last < signed:
        detail = f"the chain ends at #{last}, signed up to #{signed}"
        raise Failure(DELETED, detail, signed, checkpoint["head_event_id"])
    if signed <= base:
        detail = f"the checkpoint signs #{signed}, before the chain's anchor #{base}"
        raise Failure(NOT_COVERED, detail, signed, checkpoint["head_event_id"])
    head = rows[signed - base - 1]
    if (
        head["content"]["id"] != checkpoint["head_event_id"]
        or head["hash"] != checkpoint["head_hash"]
    ):
        detail = "not the event and hash the checkpoint signed"
        raise Failure(ALTERED, detail, signed, head["content"]["id"])
    if last > signed:
        detail = (
            f"events #{signed + 1}-#{last} come after the signed head "
            f"#{signed}: no checkpoint signs them (export the bundle again)"
        )
        nxt = rows[signed - base]["content"]["id"]
        raise Failure(NOT_COVERED, detail, signed + 1, nxt)


# --- RFC 9162 inclusion proofs in a C2SP signed tree head ---------------------------
# A second, standard-library copy of audit/merkle.py's verify_inclusion and
# audit/tlog.py's note reading, which this file cannot import;
# tests/unit/audit/test_tlog_trials.py runs both on the same proofs.


def _node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf).digest()


def inclusion_root(
    *, leaf: bytes, index: int, size: int, proof: Sequence[bytes]
) -> bytes | None:
    """RFC 9162 2.1.3.2: the root ``proof`` leads ``leaf`` at ``index`` to, in a
    tree of ``size`` leaves; None when the proof cannot be one."""
    if not 0 <= index < size:
        return None
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if len(p) != 32 or sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = _node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = _node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def _note_key_hash(name: str, public: Ed25519PublicKey) -> bytes:
    raw = public.public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    return hashlib.sha256(name.encode() + b"\n\x01" + raw).digest()[:4]


def _open_checkpoint(
    note: str, *, origin: str, public_keys: Mapping[str, Ed25519PublicKey]
) -> tuple[int, bytes]:
    """The size and root of a C2SP checkpoint note signed by a given key under
    ``origin``."""
    body, sep, lines = note.rpartition("\n\n")
    if not sep or not lines.endswith("\n"):
        raise _malformed("log.checkpoint is not a signed note")
    body += "\n"
    text = body[:-1].split("\n")
    if len(text) < 3 or text[0] != origin:
        raise Failure(NOT_COVERED, "the tree head is not this tenant's log")
    if not text[1].isdigit():
        raise _malformed("log.checkpoint has no tree size")
    size, root = int(text[1]), base64.b64decode(text[2], validate=True)
    for line in lines[:-1].split("\n"):
        name, _, blob = line.removeprefix("\N{EM DASH} ").partition(" ")
        raw = base64.b64decode(blob, validate=True)
        for public in public_keys.values():
            if name != origin or raw[:4] != _note_key_hash(origin, public):
                continue
            try:
                public.verify(raw[4:], body.encode())
            except InvalidSignature:
                continue
            if len(root) != 32:
                raise _malformed("log.checkpoint's root is not 32 bytes")
            return size, root
    raise Failure(FORGED_CHECKPOINT, "no given key signed the tree head")


def _check_log(
    log: Any,
    rows: Sequence[Mapping[str, Any]],
    *,
    tenant_id: str,
    public_keys: Mapping[str, Ed25519PublicKey],
) -> tuple[int, bytes, int]:
    """The tree head's signature and each inclusion proof; (head size, root,
    events proven included)."""
    log = _object(log, "log")
    origin = LOG_ORIGIN_PREFIX + tenant_id
    size, root = _open_checkpoint(
        str(log["checkpoint"]), origin=origin, public_keys=public_keys
    )
    by_id = {row["content"]["id"]: row for row in rows}
    proven: set[str] = set()
    for entry in log["inclusion"]:
        entry = _object(entry, "log.inclusion entry")
        if extra := sorted(set(entry) - INCLUSION_MEMBERS):
            # Nothing would check them: a member no check reads is an edit.
            detail = f"an inclusion proof carries members no check reads: {extra}"
            event_id = entry.get("event_id")
            raise Failure(ALTERED, detail, event_id=event_id, section="log")
        row = by_id.get(entry["event_id"])
        if row is None or entry["event_id"] in proven:
            raise Failure(INSERTED, "an inclusion proof of no event of this chain")
        leaf = leaf_hash(bytes.fromhex(row["hash"]))
        proof = [bytes.fromhex(node) for node in entry["proof"]]
        index = entry["index"]
        if (
            not isinstance(index, int)
            or inclusion_root(leaf=leaf, index=index, size=size, proof=proof) != root
        ):
            detail = "its inclusion proof does not lead to the signed tree head"
            raise Failure(FORGED_PROOF, detail, row.get("seq"), entry["event_id"])
        proven.add(entry["event_id"])
    return size, root, len(proven)


# --- The export record: every section bound (bundle version 3) --------------------


def section_digest(value: Any) -> str:
    """SHA-256 hex of a section's RFC 8785 JSON, by the payload digest's rule."""
    return payload_digest(value)


def _check_export(
    bundle: Mapping[str, Any], *, tenant_id: str, task_id: str, size: int, root: bytes
) -> tuple[tuple[str, ...], str]:
    """The export record (an ``audit.exported`` event of the tenant) proven in the
    signed tree head, and every other section against the digest it lists.

    Returns (the bound sections, the record's event id)."""
    export = _object(bundle.get("export"), "export")
    event = _object(export.get("event"), "export.event")
    content = _object(event.get("content"), "export.event.content")
    event_id = content.get("id")
    try:
        recomputed = event_hash(prev_hash=event.get("prev_hash"), content=content)
    except (CanonicalizationError, UnicodeEncodeError, AttributeError, TypeError):
        recomputed = None
    if recomputed != event.get("hash"):
        detail = "the export record's content does not match its hash"
        raise Failure(ALTERED, detail, event_id=event_id, section="export")
    if content.get("v") != CHAIN_FORMAT_V2 or payload_digest(
        event.get("payload")
    ) != content.get("payload_digest"):
        detail = "the export record's payload does not match its digest"
        raise Failure(ALTERED, detail, event_id=event_id, section="export")
    payload = _object(event["payload"], "export.event.payload")
    if (content.get("code"), content.get("tenant_id"), payload.get("task_id")) != (
        EXPORT_CODE,
        tenant_id,
        task_id,
    ):
        detail = "the export record is not this task's export"
        raise Failure(NOT_COVERED, detail, event_id=event_id, section="export")
    proof, index = export.get("proof"), export.get("index")
    if proof is None:
        detail = (
            "the export record is not in the signed tree head yet (export the bundle "
            "again in a minute): no section but chain, checkpoint and log is checked"
        )
        raise Failure(NOT_COVERED, detail, event_id=event_id, section="export")
    nodes = [bytes.fromhex(node) for node in proof]
    leaf = leaf_hash(bytes.fromhex(str(event["hash"])))
    if (
        not isinstance(index, int)
        or inclusion_root(leaf=leaf, index=index, size=size, proof=nodes) != root
    ):
        detail = "the export record's inclusion proof does not lead to the signed root"
        raise Failure(FORGED_PROOF, detail, event_id=event_id, section="export")
    listed: dict[str, Any] = {}
    for item in payload.get("sections") or []:
        item = _object(item, "a listed section")
        listed[str(item.get("section"))] = item.get("digest")
    present = {name for name in bundle if name not in UNBOUND_SECTIONS}
    for name in sorted(present | set(listed)):
        if name not in listed:
            detail = "not in the export record: added after the export"
            raise Failure(ALTERED, detail, section=name)
        if name not in bundle:
            raise Failure(DELETED, "listed by the export record, missing", section=name)
        if section_digest(bundle[name]) != listed[name]:
            detail = "not what was exported (its digest is not the export record's)"
            raise Failure(ALTERED, detail, section=name)
    return tuple(sorted(present)), str(event_id)


# --- Witnesses' cosignatures and RFC 3161 tokens on the tree head -----------------
# A copy of audit/witness.py's cosignature check (c2sp.org/tlog-cosignature,
# cosignature/v1, Ed25519) and of audit/timestamp.py's token check, which this file
# cannot import; tests/audit_log/test_witness_trials.py runs both on the same input.

FORGED_COSIGNATURE: Final = "forged cosignature"
REPLAYED_COSIGNATURE: Final = "replayed cosignature"
NOT_WITNESSED: Final = "not witnessed"
FORGED_TIMESTAMP: Final = "forged timestamp"
TIMESTAMP_FOR_ANOTHER_HEAD: Final = "timestamp for another head"
NOT_TIMESTAMPED: Final = "not timestamped"
# How far a witness's clock may trail the portal's.
CLOCK_SKEW_S: Final = 60


@dataclass(frozen=True)
class WitnessKey:
    name: str
    public: Ed25519PublicKey

    @property
    def key_id(self) -> bytes:
        raw = self.public.public_bytes(
            encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
        )
        return hashlib.sha256(self.name.encode() + b"\n\x04" + raw).digest()[:4]


def load_witness_key(source: str) -> WitnessKey:
    """A witness's verifier key ``name+hex key ID+base64(0x04 || key)``, or a file
    holding it (anything after it on the line, such as its URL, is ignored).

    Raises:
        UnusableKey: not such a key, or its ID does not match.
    """
    path = Path(source)
    text = path.read_text().strip() if "+" not in source and path.is_file() else source
    vkey = text.split()[0] if text.split() else ""
    name, _, rest = vkey.partition("+")
    key_id, _, encoded = rest.partition("+")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except ValueError:
        raw = b""
    if not name or len(raw) != 33 or raw[:1] != b"\x04":
        raise UnusableKey(
            f"{source}: not a witness key (name+keyid+base64(0x04 || key))"
        )
    witness = WitnessKey(name=name, public=Ed25519PublicKey.from_public_bytes(raw[1:]))
    if witness.key_id.hex() != key_id.lower():
        raise UnusableKey(f"{source}: the key ID does not match the key")
    return witness


def _epoch(text: str) -> int:
    import datetime as dt

    # %z reads the trailing "Z" as UTC.
    return int(dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp())


def _check_cosignatures(
    note: str, witnesses: Sequence[WitnessKey], *, not_before: int
) -> None:
    """Each witness's valid cosignature on the note's body, no older than the
    signed checkpoint it vouches for (``not_before``, less the clock skew)."""
    body, _, lines = note.rpartition("\n\n")
    body += "\n"
    for witness in witnesses:
        named = [
            line.split(" ", 2)
            for line in lines.splitlines()
            if line.startswith(f"\N{EM DASH} {witness.name} ")
        ]
        if not named:
            raise Failure(NOT_WITNESSED, f"no cosignature by witness {witness.name}")
        replayed = False
        for _, _, blob in named:
            try:
                raw = base64.b64decode(blob, validate=True)
            except ValueError:
                continue
            if len(raw) != 76 or raw[:4] != witness.key_id:
                continue
            stamp = int.from_bytes(raw[4:12], "big")
            if stamp < not_before - CLOCK_SKEW_S:
                replayed = True
                continue
            message = f"cosignature/v1\ntime {stamp}\n{body}".encode()
            try:
                witness.public.verify(raw[12:], message)
            except InvalidSignature:
                continue
            break
        else:
            if replayed:
                detail = (
                    f"witness {witness.name}'s cosignature is older than the signed "
                    "checkpoint it would vouch for (replayed from an earlier head)"
                )
                raise Failure(REPLAYED_COSIGNATURE, detail)
            detail = f"no line by witness {witness.name}'s key verifies on this head"
            raise Failure(FORGED_COSIGNATURE, detail)


def _check_timestamps(log: Mapping[str, Any], roots_pem: Sequence[bytes]) -> int:
    """One RFC 3161 token over the tree head's body that chains to a given root;
    returns how many tokens were checked. Needs ``rfc3161-client``."""
    import rfc3161_client
    from cryptography import x509

    body = str(log["checkpoint"]).rpartition("\n\n")[0] + "\n"
    imprint = hashlib.sha256(body.encode()).digest()
    roots = [cert for pem in roots_pem for cert in x509.load_pem_x509_certificates(pem)]
    tokens = log.get("rfc3161") or []
    if not tokens:
        raise Failure(NOT_TIMESTAMPED, "the tree head carries no RFC 3161 token")
    kind, detail = NOT_TIMESTAMPED, "no token"
    for entry in tokens:
        try:
            answer = rfc3161_client.decode_timestamp_response(
                base64.b64decode(_object(entry, "a token")["token"], validate=True)
            )
        except ValueError as error:
            kind, detail = FORGED_TIMESTAMP, f"not a time-stamp response: {error}"
            continue
        if answer.tst_info.message_imprint.message != imprint:
            kind = TIMESTAMP_FOR_ANOTHER_HEAD
            detail = "the token imprints another head's hash"
            continue
        for root in roots:
            builder = rfc3161_client.VerifierBuilder().add_root_certificate(root)
            try:
                builder.build().verify_message(answer, body.encode())
            except (rfc3161_client.VerificationError, ValueError):
                continue
            return len(tokens)
        kind, detail = FORGED_TIMESTAMP, "the token does not verify to a given root"
    raise Failure(kind, detail)


def _check_derived(
    bundle: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The sections made from the chain's (checked) events must say what they do.

    Returns what could not be checked: a decision's resolution and note once
    retention dropped its event's payload."""
    chain = bundle["chain"]
    if chain.get("length") != len(rows) or chain.get("head_hash") != (
        rows[-1]["hash"] if rows else None
    ):
        detail = "chain.length or chain.head_hash is not the chain's"
        raise Failure(ALTERED, detail, section="chain")
    given = bundle.get("takeover_decisions")
    expected: list[Any] = []
    unchecked: list[str] = []
    for row in (row for row in rows if row["content"]["code"] in DECISION_CODES):
        content, i = row["content"], len(expected)
        dropped = content["v"] == CHAIN_FORMAT_V2 and row.get("payload") is None
        payload = (
            content["payload"]
            if content["v"] != CHAIN_FORMAT_V2
            else row.get("payload")
        )
        payload = payload if isinstance(payload, Mapping) else {}
        decision = {
            "seq": row["seq"],
            "event_id": content["id"],
            "code": content["code"],
            "by": {
                "actor_type": content["actor_type"],
                "actor_id": content["actor_id"],
            },
            "at": content["created_at"],
            "operation_id": content["operation_id"],
            "reason_code": content["reason_code"],
            "resolution": payload.get("resolution"),
            "note": payload.get("note"),
        }
        if dropped and isinstance(given, list) and i < len(given):
            theirs = _object(given[i], "a takeover decision")
            decision["resolution"] = theirs.get("resolution")
            decision["note"] = theirs.get("note")
            unchecked.append(f"takeover_decisions[{i}].resolution/note (payload gone)")
        expected.append(decision)
    if given is not None and given != expected:
        detail = "takeover_decisions does not say what the chain's events say"
        raise Failure(ALTERED, detail, section="takeover_decisions")
    return unchecked


def _not_checked(bundle: Mapping[str, Any]) -> tuple[str, ...]:
    names = [name for name in bundle if name not in CHECKED_SECTIONS]
    names += [
        f"chain.{name}" for name in bundle["chain"] if name not in CHECKED_CHAIN_MEMBERS
    ]
    return tuple(sorted(names))


# What the checks of log and export read; their other members only describe.
CHECKED_LOG_MEMBERS: Final = frozenset({"checkpoint", "inclusion"})
# The members of one ``log.inclusion`` entry; any other is an edit.
INCLUSION_MEMBERS: Final = frozenset({"event_id", "index", "proof"})
CHECKED_EXPORT_MEMBERS: Final = frozenset({"event", "index", "proof"})


def _unbound_members(
    bundle: Mapping[str, Any], *, timestamps_checked: bool
) -> tuple[str, ...]:
    """The members of log and export (which the export record does not bind) that
    no check reads: their descriptions, and the RFC 3161 tokens without
    ``--tsa-root``."""
    checked = {
        "log": CHECKED_LOG_MEMBERS | ({"rfc3161"} if timestamps_checked else set()),
        "export": CHECKED_EXPORT_MEMBERS,
    }
    return tuple(
        sorted(
            f"{section}.{name}"
            for section, members in checked.items()
            for name in _object(bundle[section], section)
            if name not in members
        )
    )


def verify_bundle(
    bundle: Any,
    public_keys: Mapping[str, Ed25519PublicKey],
    witnesses: Sequence[WitnessKey] = (),
    tsa_roots: Sequence[bytes] = (),
) -> Intact:
    """Check a parsed bundle; returns what was verified.

    Raises:
        Failure: the first failure, with its kind.
    """
    try:
        return _verify(bundle, public_keys, witnesses, tsa_roots)
    except Failure:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        # A field of an unexpected type somewhere: never a traceback, never intact.
        raise _malformed(
            f"unexpected content ({type(error).__name__}: {error})"
        ) from None


def _verify(
    bundle: Any,
    public_keys: Mapping[str, Ed25519PublicKey],
    witnesses: Sequence[WitnessKey] = (),
    tsa_roots: Sequence[bytes] = (),
) -> Intact:
    bundle = _object(bundle, "the bundle")
    if bundle.get("format") != BUNDLE_FORMAT:
        detail = f"not an evidence bundle (format {bundle.get('format')!r})"
        raise Failure(MALFORMED, detail, section="format")
    version = bundle.get("version")
    if not isinstance(version, int) or version not in BUNDLE_VERSIONS:
        detail = f"bundle version {version!r} is not known"
        raise Failure(MALFORMED, detail, section="version")
    chain = _object(bundle.get("chain"), "chain")
    tenant_id, task_id = chain.get("tenant_id"), chain.get("task_id")
    if not isinstance(tenant_id, str) or not isinstance(task_id, str):
        raise _malformed("the chain does not name its tenant and task")
    task = _object(bundle.get("task"), "task")
    if task.get("id") != task_id:
        detail = "the task section names another task than the chain"
        raise Failure(MALFORMED, detail, section="task")
    events = chain.get("events")
    if not isinstance(events, list):
        raise _malformed("chain.events is not a list")
    checkpoint = bundle.get("checkpoint")
    if checkpoint is not None:
        checkpoint = _object(checkpoint, "checkpoint")
        _check_signature(checkpoint, public_keys)
    anchor = _anchor(chain)
    rows = _check_chain(events, tenant_id=tenant_id, task_id=task_id, anchor=anchor)
    base = anchor["seq"] if anchor else 0
    _check_coverage(rows, checkpoint, tenant_id=tenant_id, task_id=task_id, base=base)
    assert checkpoint is not None  # _check_coverage refuses a bundle without
    if anchor is not None:
        detail = (
            f"retention purged events #1-#{base}; the events after its anchor verify, "
            "but that the anchor stands for a recorded purge only manage.py "
            "verify_audit can prove (the purge's audit.purged tombstone)"
        )
        raise Failure(UNPROVEN_ANCHOR, detail, base, anchor.get("event_id"))
    unchecked = _check_derived(bundle, rows)
    log_size: int | None = None
    logged = 0
    if bundle.get("log") is not None:
        log_size, root, logged = _check_log(
            bundle["log"], rows, tenant_id=tenant_id, public_keys=public_keys
        )
    bound: tuple[str, ...] = ()
    export_event: str | None = None
    if bundle["version"] >= BOUND_FROM_VERSION:
        # Every other section against the export record proven in the head: an
        # edit the checks above cannot see (operations, task, …) is named here.
        if log_size is None:
            detail = "no signed tree head: the export record is not proven"
            raise Failure(NOT_COVERED, detail, section="log")
        bound, export_event = _check_export(
            bundle, tenant_id=tenant_id, task_id=task_id, size=log_size, root=root
        )
    witnessed: tuple[str, ...] = ()
    timestamps = 0
    if witnesses or tsa_roots:
        log = bundle.get("log")
        if log is None:
            kind = NOT_WITNESSED if witnesses else NOT_TIMESTAMPED
            raise Failure(kind, "the bundle has no signed tree head")
        log = _object(log, "log")
        if witnesses:
            _check_cosignatures(
                str(log["checkpoint"]),
                witnesses,
                not_before=_epoch(str(checkpoint["signed_at"])),
            )
            witnessed = tuple(witness.name for witness in witnesses)
        if tsa_roots:
            timestamps = _check_timestamps(log, tsa_roots)
    return Intact(
        tenant_id=tenant_id,
        task_id=task_id,
        events=len(rows),
        head_hash=rows[-1]["hash"],
        signed_at=str(checkpoint["signed_at"]),
        key_id=str(checkpoint["key_id"]),
        log_size=log_size,
        logged=logged,
        not_checked=(
            _unbound_members(bundle, timestamps_checked=bool(tsa_roots))
            if bound
            else _not_checked(bundle)
        )
        + tuple(unchecked),
        bound=bound,
        export_event=export_event,
        witnessed=witnessed,
        timestamps=timestamps,
    )


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; a name given twice would let two readers see two values."""
    members: dict[str, Any] = {}
    for name, value in pairs:
        if name in members:
            raise _malformed(f"the member {name!r} appears twice in one object")
        members[name] = value
    return members


def _reject_constant(name: str) -> Any:
    raise _malformed(f"{name} is not JSON")


def parse_bundle(data: bytes) -> Any:
    """The bundle's JSON (UTF-8, strict: no NaN, no repeated member names).

    Raises:
        Failure: ``malformed``.
    """
    try:
        return json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_unique_members,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError) as error:
        raise _malformed(f"not JSON: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Verify a task's evidence bundle offline (exit 0 intact, 1 "
        "broken, 2 unusable arguments)."
    )
    parser.add_argument("bundle", help="the bundle's JSON file ('-': standard input)")
    parser.add_argument(
        "--public-key",
        action="append",
        required=True,
        metavar="KEY",
        help="a PEM file, the JSON of GET /api/v1/audit/public-key saved to a file, "
        "or PEM text; repeat for rotated keys",
    )
    parser.add_argument(
        "--witness-key",
        action="append",
        default=[],
        metavar="VKEY",
        help="require this witness's cosignature on the tree head: its verifier key "
        "(name+keyid+base64) or a file holding it; repeatable",
    )
    parser.add_argument(
        "--tsa-root",
        action="append",
        default=[],
        metavar="PEM",
        help="require an RFC 3161 token on the tree head that chains to this root "
        "(needs the rfc3161-client package); repeatable",
    )
    args = parser.parse_args(argv)
    try:
        public_keys = dict(load_public_key(source) for source in args.public_key)
        witnesses = [load_witness_key(source) for source in args.witness_key]
        tsa_roots = [Path(source).read_bytes() for source in args.tsa_root]
        if tsa_roots:
            import rfc3161_client  # noqa: F401 (needed only for --tsa-root)
    except ImportError:
        print("--tsa-root needs the rfc3161-client package", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        print(f"unusable TSA root: {error}", file=sys.stderr)
        return EXIT_USAGE
    except UnusableKey as error:
        print(f"unusable key: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.bundle == "-":
            data = sys.stdin.buffer.read()
        else:
            data = Path(args.bundle).read_bytes()
    except OSError as error:
        print(f"cannot read the bundle: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        intact = verify_bundle(parse_bundle(data), public_keys, witnesses, tsa_roots)
    except Failure as failure:
        print(f"FAILED {failure}")
        return EXIT_BROKEN
    print(intact)
    return EXIT_INTACT


if __name__ == "__main__":
    sys.exit(main())
