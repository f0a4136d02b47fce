"""A transparency-log witness (C2SP ``tlog-witness``) and its cosignatures.

A witness is a separate process with its own Ed25519 key (``manage.py witness``,
docs/audit-integrity.md, "Witnesses"). The checkpoint job sends it each new tree
head of a tenant's log with a consistency proof from the last head it cosigned;
the witness checks the log's signature and the proof and answers with a
cosignature (``c2sp.org/tlog-cosignature``, ``cosignature/v1``, Ed25519)::

    — <witness name> base64(key ID4 || u64 timestamp || Ed25519 signature64)

over ``"cosignature/v1\\ntime <timestamp>\\n" || checkpoint body``, with key ID
``SHA-256(name || 0x0A || 0x04 || public key)[:4]``. It keeps, per log origin, the
last checkpoint it cosigned in a file of its own state directory, outside the
portal's database: whoever rewrites the database cannot make it cosign a head that
does not extend that one, so a cut or rewritten log shows against the witness.

This module is the protocol on both sides, no database: ``cosign`` and
``cosignature_open`` (the format), ``WitnessState`` (the files, written with
fsync and rename), ``Witness.add_checkpoint`` (the spec's checks and answers) and
``serve`` (the HTTP front), and ``run``, which ``manage.py witness`` and
``python -m audit.witness`` (no Django settings, no database: what a third party
runs) share. ``audit/witness_client.py`` is the portal's side.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import fcntl
import hashlib
import http.server
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from . import merkle, tlog

ALG_COSIGNATURE_V1: Final = b"\x04"
COSIGNATURE_HEADER: Final = "cosignature/v1\n"
MAX_PROOF_LINES: Final = 63
MAX_BODY: Final = 64 * 1024
SIZE_CONTENT_TYPE: Final = "text/x.tlog.size"


class CosignatureError(ValueError):
    """A cosignature line that is malformed or not this witness's over this body."""


def cosignature_key_hash(name: str, public: Ed25519PublicKey) -> bytes:
    """The 4-byte key ID of an Ed25519 ``cosignature/v1`` key."""
    data = name.encode("utf-8") + b"\n" + ALG_COSIGNATURE_V1 + tlog.raw_public(public)
    return hashlib.sha256(data).digest()[:4]


def verifier_key(name: str, public: Ed25519PublicKey) -> str:
    """``<name>+<hex key ID>+<base64(0x04 || key)>``: the vkey verifiers configure."""
    encoded = base64.b64encode(ALG_COSIGNATURE_V1 + tlog.raw_public(public)).decode()
    return f"{name}+{cosignature_key_hash(name, public).hex()}+{encoded}"


def verifier_key_parse(vkey: str) -> tuple[str, Ed25519PublicKey]:
    """The name and key of a ``cosignature/v1`` vkey.

    Raises:
        CosignatureError: not ``name+hash+base64(0x04 || 32-byte key)`` or the
            hash does not match.
    """
    name, sep, rest = vkey.strip().partition("+")
    key_id, sep2, encoded = rest.partition("+")
    if not (sep and sep2 and name):
        raise CosignatureError("a witness key is name+keyid+base64 key")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise CosignatureError("the witness key is not base64") from None
    if len(raw) != 33 or raw[:1] != ALG_COSIGNATURE_V1:
        raise CosignatureError("not an Ed25519 cosignature/v1 key (type 0x04)")
    public = Ed25519PublicKey.from_public_bytes(raw[1:])
    if cosignature_key_hash(name, public).hex() != key_id.lower():
        raise CosignatureError("the witness key's ID does not match its key")
    return name, public


def cosigned_message(body: str, timestamp: int) -> bytes:
    return f"{COSIGNATURE_HEADER}time {timestamp}\n{body}".encode()


def cosign(*, body: str, name: str, private: Ed25519PrivateKey, timestamp: int) -> str:
    """This witness's cosignature line on a checkpoint body, at ``timestamp``."""
    if not 0 < timestamp < 2**63:
        raise CosignatureError("a cosignature's timestamp is a positive u64")
    signature = private.sign(cosigned_message(body, timestamp))
    raw = (
        cosignature_key_hash(name, private.public_key())
        + timestamp.to_bytes(8, "big")
        + signature
    )
    return f"{tlog.SIGNATURE_DASH}{name} {base64.b64encode(raw).decode()}\n"


@dataclass(frozen=True)
class Cosignature:
    name: str
    key_id: bytes
    timestamp: int
    signature: bytes
    line: str


def cosignature_lines(note: str) -> list[Cosignature]:
    """The signature lines of a note (or of a witness's answer) read as
    cosignatures: name, key ID, timestamp, signature. Lines too short for one are
    left out (the log's own note signature is 68 bytes)."""
    _, sep, lines = note.rpartition("\n\n")
    text = lines if sep else note
    found = []
    for line in text.splitlines():
        if not line.startswith(tlog.SIGNATURE_DASH):
            continue
        name, _, blob = line[len(tlog.SIGNATURE_DASH) :].partition(" ")
        try:
            raw = base64.b64decode(blob, validate=True)
        except binascii.Error:
            continue
        if len(raw) != 4 + 8 + 64:
            continue
        found.append(
            Cosignature(
                name=name,
                key_id=raw[:4],
                timestamp=int.from_bytes(raw[4:12], "big"),
                signature=raw[12:],
                line=line + "\n",
            )
        )
    return found


def cosignature_open(
    line: str, *, body: str, name: str, public: Ed25519PublicKey
) -> int:
    """The timestamp of ``line`` when it is the witness's cosignature on ``body``.

    Raises:
        CosignatureError: not a line of this name and key, or its signature does
            not verify over this body at its timestamp.
    """
    parsed = cosignature_lines(
        f"x\n\n{line if line.endswith(chr(10)) else line + chr(10)}"
    )
    if len(parsed) != 1:
        raise CosignatureError("not a cosignature line")
    cosig = parsed[0]
    if cosig.name != name or cosig.key_id != cosignature_key_hash(name, public):
        raise CosignatureError(f"not a cosignature by witness {name}")
    if not 0 < cosig.timestamp < 2**63:
        raise CosignatureError("a cosignature's timestamp is a positive u64")
    try:
        public.verify(cosig.signature, cosigned_message(body, cosig.timestamp))
    except InvalidSignature:
        raise CosignatureError(
            f"witness {name}'s cosignature does not verify on this head"
        ) from None
    return cosig.timestamp


def origin_hash(origin: str) -> str:
    return hashlib.sha256(origin.encode("utf-8")).hexdigest()


# --- the witness's state: one file per log origin, outside the database --------


class WitnessState:
    """The last checkpoint cosigned per origin: ``<dir>/<sha256(origin)>.checkpoint``
    holds that note (the log's signature and this witness's cosignature).

    Written atomically (a scratch file, fsync, rename, fsync of the directory), so
    a crash leaves the old or the new checkpoint, never half of one. ``locked``
    takes an exclusive lock on the directory, so two witness processes on one
    state directory still check and write one at a time.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()

    def path(self, origin: str) -> Path:
        return self.directory / f"{origin_hash(origin)}.checkpoint"

    def latest(self, origin: str) -> str | None:
        try:
            return self.path(origin).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def latest_by_hash(self, digest: str) -> str | None:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            return None
        try:
            return (self.directory / f"{digest}.checkpoint").read_text("utf-8")
        except FileNotFoundError:
            return None

    def write(self, origin: str, note: str) -> None:
        path = self.path(origin)
        scratch = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        with open(scratch, "w", encoding="utf-8") as file:
            file.write(note)
            file.flush()
            os.fsync(file.fileno())
        os.replace(scratch, path)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    class _Locked:
        def __init__(self, state: WitnessState) -> None:
            self.state = state
            self.fd = -1

        def __enter__(self) -> None:
            self.state._lock.acquire()
            self.fd = os.open(self.state.directory, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX)

        def __exit__(self, *_: object) -> None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.state._lock.release()

    def locked(self) -> WitnessState._Locked:
        return WitnessState._Locked(self)


# --- the witness: add-checkpoint --------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    content_type: str = "text/plain; charset=utf-8"


def _request_parse(data: bytes) -> tuple[int, list[bytes], str]:
    """(old size, proof, checkpoint note) of an add-checkpoint body.

    Raises:
        ValueError: not the spec's request format.
    """
    text = data.decode("utf-8")
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise ValueError("no blank line before the checkpoint")
    lines = head.split("\n")
    old = lines[0].removeprefix("old ")
    if lines[0] == old or not old.isascii() or not old.isdigit():
        raise ValueError("the first line is not 'old <size>'")
    if old != "0" and old.startswith("0"):
        raise ValueError("the old size has leading zeros")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise ValueError("more than 63 consistency proof lines")
    proof = []
    for line in lines[1:]:
        node = base64.b64decode(line, validate=True)
        if len(node) != 32:
            raise ValueError("a proof line is not a 32-byte hash")
        proof.append(node)
    return int(old), proof, note


class Witness:
    """The add-checkpoint checks of c2sp.org/tlog-witness, for the logs whose
    origin starts with ``origin_prefix`` and whose notes one of ``log_keys`` signs
    (the key name is the origin, as the portal's tree heads have it)."""

    def __init__(
        self,
        *,
        name: str,
        private: Ed25519PrivateKey,
        state: WitnessState,
        log_keys: Sequence[Ed25519PublicKey],
        origin_prefix: str = tlog.ORIGIN_PREFIX,
        clock: object = None,
    ) -> None:
        self.name = name
        self.private = private
        self.state = state
        self.log_keys = list(log_keys)
        self.origin_prefix = origin_prefix
        self._clock = clock or time.time

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    def _now(self) -> int:
        return int(self._clock())  # type: ignore[operator]

    def add_checkpoint(self, data: bytes) -> Answer:
        try:
            old_size, proof, note = _request_parse(data)
            body = note.rpartition("\n\n")[0] + "\n"
            checkpoint = tlog.checkpoint_parse(body)
        except (ValueError, UnicodeDecodeError) as error:
            return Answer(400, f"malformed request: {error}\n")
        origin = checkpoint.origin
        if not origin.startswith(self.origin_prefix):
            return Answer(404, "unknown log origin\n")
        if not self._log_signed(note, origin):
            return Answer(403, "no valid signature by a trusted key for this log\n")
        if old_size > checkpoint.size:
            return Answer(400, "the old size is larger than the checkpoint's\n")
        if checkpoint.size == 0 and checkpoint.root != merkle.EMPTY_ROOT:
            return Answer(422, "an empty tree's root is the hash of nothing\n")
        with self.state.locked():
            latest = self.state.latest(origin)
            known = (
                tlog.checkpoint_parse(latest.rpartition("\n\n")[0] + "\n")
                if latest
                else None
            )
            known_size = known.size if known else 0
            if old_size != known_size:
                return Answer(409, f"{known_size}\n", SIZE_CONTENT_TYPE)
            if old_size == 0 and proof:
                return Answer(422, "a proof from the empty tree must be empty\n")
            if known is not None:
                try:
                    merkle.verify_consistency(
                        old_size=known.size,
                        new_size=checkpoint.size,
                        old_root=known.root,
                        new_root=checkpoint.root,
                        proof=proof,
                    )
                except merkle.ProofError as error:
                    return Answer(
                        422, f"not consistent with the last cosigned: {error}\n"
                    )
            line = cosign(
                body=body, name=self.name, private=self.private, timestamp=self._now()
            )
            log_lines = "".join(
                f"{raw}\n"
                for raw in note.rpartition("\n\n")[2].splitlines()
                if not raw.startswith(f"{tlog.SIGNATURE_DASH}{self.name} ")
            )
            self.state.write(origin, f"{body}\n{log_lines}{line}")
        return Answer(200, line)

    def _log_signed(self, note: str, origin: str) -> bool:
        for public in self.log_keys:
            try:
                tlog.note_open(note, name=origin, public=public)
            except tlog.NoteError as error:
                if "invalid signature" in str(error):
                    return False  # a line of a trusted key that does not verify
                continue
            return True
        return False

    def latest(self, digest: str) -> Answer:
        note = self.state.latest_by_hash(digest)
        if note is None:
            return Answer(404, "no checkpoint cosigned for this log\n")
        return Answer(200, note)


def serve(witness: Witness, host: str, port: int) -> http.server.ThreadingHTTPServer:
    """An HTTP server for ``witness`` (``POST /add-checkpoint``, ``GET
    /<origin hash>/checkpoint``); the caller runs ``serve_forever``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, answer: Answer) -> None:
            data = answer.body.encode("utf-8")
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path != "/add-checkpoint":
                self._answer(Answer(404, "not found\n"))
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                self.close_connection = True
                self._answer(Answer(400, "a body of known length up to 64 KiB\n"))
                return
            self._answer(witness.add_checkpoint(self.rfile.read(length)))

        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if len(parts) == 2 and parts[1] == "checkpoint":
                self._answer(witness.latest(parts[0]))
            else:
                self._answer(Answer(404, "not found\n"))

        def log_message(self, format: str, *args: object) -> None:
            pass

    return http.server.ThreadingHTTPServer((host, port), Handler)


def load_or_make_key(path: Path) -> Ed25519PrivateKey:
    """The witness's private key from a PEM file; made (0600) when missing."""
    if not path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as file:
                file.write(pem)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def log_keys_load(pems: Mapping[str, bytes]) -> list[Ed25519PublicKey]:
    keys = []
    for name, pem in pems.items():
        key = serialization.load_pem_public_key(pem)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"{name}: not an Ed25519 public key")
        keys.append(key)
    return keys


def run(
    *,
    name: str,
    key_file: Path,
    state_dir: Path,
    log_key_files: Sequence[str],
    listen: str,
    origin_prefix: str = tlog.ORIGIN_PREFIX,
    print_key: bool = False,
    write: Callable[[str], None] = print,
) -> None:
    """Load (or make) the key, then print the verifier key (``print_key``) or
    serve until SIGTERM. Writes ``witness <name> on <url> state <dir>`` and ``key
    <vkey>`` once it listens.

    Raises:
        OSError, ValueError: an unreadable or wrong key file.
    """
    private = load_or_make_key(key_file)
    vkey = verifier_key(name, private.public_key())
    if print_key:
        write(vkey)
        return
    log_keys = log_keys_load({f: Path(f).read_bytes() for f in log_key_files})
    host, _, port = listen.rpartition(":")
    server = serve(
        Witness(
            name=name,
            private=private,
            state=WitnessState(state_dir),
            log_keys=log_keys,
            origin_prefix=origin_prefix,
        ),
        host or "127.0.0.1",
        int(port),
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    bound_host, bound_port = server.server_address[:2]
    write(f"witness {name} on http://{bound_host!s}:{bound_port} state {state_dir}")
    write(f"key {vkey}")
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m audit.witness --state-dir DIR --key-file F --log-key PEM``."""
    parser = argparse.ArgumentParser(
        description="A C2SP tlog-witness for the portal's tree heads."
    )
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--key-file", required=True, type=Path)
    parser.add_argument("--log-key", action="append", default=[], metavar="PEM")
    parser.add_argument("--name", default="witness.local/portal-dev")
    parser.add_argument("--origin-prefix", default=tlog.ORIGIN_PREFIX)
    parser.add_argument("--listen", default="127.0.0.1:7380", metavar="HOST:PORT")
    parser.add_argument("--print-key", action="store_true")
    args = parser.parse_args(argv)
    if not args.log_key and not args.print_key:
        parser.error("--log-key (the portal's public key file) is required")
    try:
        run(
            name=args.name,
            key_file=args.key_file,
            state_dir=args.state_dir,
            log_key_files=args.log_key,
            listen=args.listen,
            origin_prefix=args.origin_prefix,
            print_key=args.print_key,
            write=lambda line: print(line, flush=True),  # noqa: T201 (its CLI)
        )
    except (OSError, ValueError) as error:
        print(f"witness: {error}", file=sys.stderr)  # noqa: T201 (its CLI)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
