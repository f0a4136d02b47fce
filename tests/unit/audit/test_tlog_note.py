"""Tree-head notes in the C2SP signed-note format, checked against a stock vector.

The vector is golang.org/x/mod/sumdb/note's ``note_test.go`` (BSD-3-Clause):
its private key ``PRIVATE+KEY+PeterNeumann+c74f20a3+AYEK…`` signs its text into a
known note (Ed25519 signing is deterministic), and its verifier key text is known.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import tlog

GO_SIGNER = (
    "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
)
GO_VERIFIER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT + "\n\N{EM DASH} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZ"
    "InNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)
GO_ENOCH = (
    "\N{EM DASH} EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1a"
    "GrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"
)


def _go_key() -> Ed25519PrivateKey:
    raw = base64.b64decode(GO_SIGNER.split("+", 4)[4])
    assert raw[:1] == tlog.ALG_ED25519
    return Ed25519PrivateKey.from_private_bytes(raw[1:])


def test_the_key_hash_and_verifier_key_match_go():
    public = _go_key().public_key()
    assert tlog.key_hash("PeterNeumann", public).hex() == "c74f20a3"
    assert tlog.verifier_key("PeterNeumann", public) == GO_VERIFIER


def test_a_note_signed_here_is_byte_for_byte_gos():
    key = _go_key()
    signature = key.sign(GO_TEXT.encode())
    note = (
        GO_TEXT
        + "\n"
        + tlog.signature_line("PeterNeumann", key.public_key(), signature)
    )
    assert note == GO_NOTE


def test_gos_note_opens_and_a_witness_line_is_left_alone():
    public = _go_key().public_key()
    assert tlog.note_open(GO_NOTE, name="PeterNeumann", public=public) == GO_TEXT
    assert tlog.note_open(GO_NOTE + GO_ENOCH, name="PeterNeumann", public=public)


@pytest.mark.parametrize(
    "note",
    [
        GO_NOTE.replace("problem,", "problem;"),  # body edited
        GO_NOTE.replace("x08go/ZJ", "x08go/ZK"),  # signature bit changed
        GO_NOTE[:60] + "ABCD" + GO_NOTE[60:],
    ],
)
def test_an_edited_note_or_forged_signature_is_refused(note):
    with pytest.raises(tlog.NoteError):
        tlog.note_open(note, name="PeterNeumann", public=_go_key().public_key())


def test_a_line_with_another_key_hash_or_name_is_not_this_keys_signature():
    public = _go_key().public_key()
    wrong_hash = GO_NOTE.replace("x08g", "xxxx")
    with pytest.raises(tlog.NoteError, match="no signature"):
        tlog.note_open(wrong_hash, name="PeterNeumann", public=public)
    renamed = GO_NOTE.replace("PeterNeumann", "CarmenSandiego")
    with pytest.raises(tlog.NoteError, match="no signature"):
        tlog.note_open(renamed, name="PeterNeumann", public=public)
    other = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(tlog.NoteError, match="no signature"):
        tlog.note_open(GO_NOTE, name="PeterNeumann", public=other)


@pytest.mark.parametrize(
    "bad", [GO_TEXT, GO_TEXT + "\n", GO_NOTE[:-1], GO_NOTE + "Unexpected line.\n"]
)
def test_malformed_notes_are_refused(bad):
    with pytest.raises(tlog.NoteError):
        tlog.note_open(bad, name="PeterNeumann", public=_go_key().public_key())


def test_a_checkpoint_body_round_trips_and_bad_ones_are_refused():
    body = tlog.checkpoint_body(
        origin="portal.example/tenants/x", size=7, root=b"\1" * 32
    )
    assert (
        body
        == "portal.example/tenants/x\n7\nAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n"
    )
    parsed = tlog.checkpoint_parse(body)
    assert (parsed.size, parsed.root, parsed.tombstone) == (7, b"\1" * 32, False)
    tomb = tlog.checkpoint_body(
        origin="o", size=7, root=b"\1" * 32, extensions=[tlog.TOMBSTONE_LINE]
    )
    assert tlog.checkpoint_parse(tomb).tombstone
    for bad in [
        "o\n07\n" + body.split("\n")[2] + "\n",
        "o\n7\nAQE=\n",
        "o\n7\n",
        "o\n-1\nx\n",
    ]:
        with pytest.raises(tlog.NoteError):
            tlog.checkpoint_parse(bad)
