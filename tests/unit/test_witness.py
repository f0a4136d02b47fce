"""The witness's protocol (audit/witness.py) against c2sp.org/tlog-witness and
c2sp.org/tlog-cosignature, in process, without a database: every answer the spec
names, the cosignature bytes rebuilt by hand, and the state kept in files."""

from __future__ import annotations

import base64
import hashlib
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import merkle, tlog, witness

ORIGIN = f"{tlog.ORIGIN_PREFIX}00000000-0000-0000-0000-000000000001"
LOG_KEY = Ed25519PrivateKey.generate()
WITNESS_KEY = Ed25519PrivateKey.generate()
NAME = "witness.test/w1"


def _note(tree: merkle.Tree, size: int, key: Ed25519PrivateKey = LOG_KEY) -> str:
    body = tlog.checkpoint_body(origin=ORIGIN, size=size, root=tree.root(size))
    line = tlog.signature_line(ORIGIN, key.public_key(), key.sign(body.encode()))
    return f"{body}\n{line}"


def _request(old: int, proof: list[bytes], note: str) -> bytes:
    lines = [f"old {old}", *(base64.b64encode(p).decode() for p in proof)]
    return ("".join(f"{line}\n" for line in lines) + "\n" + note).encode()


@pytest.fixture
def tree() -> merkle.Tree:
    return merkle.Tree([merkle.leaf_hash(bytes([i]) * 32) for i in range(40)])


@pytest.fixture
def made(tmp_path: Path) -> witness.Witness:
    return witness.Witness(
        name=NAME,
        private=WITNESS_KEY,
        state=witness.WitnessState(tmp_path / "state"),
        log_keys=[LOG_KEY.public_key()],
        clock=lambda: 1_700_000_000,
    )


def test_a_cosignature_is_the_specs_bytes():
    body = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    line = witness.cosign(
        body=body, name=NAME, private=WITNESS_KEY, timestamp=1679315147
    )
    assert line.startswith(f"\N{EM DASH} {NAME} ") and line.endswith("\n")
    raw = base64.b64decode(line.split(" ")[2])
    public = WITNESS_KEY.public_key().public_bytes_raw()
    assert raw[:4] == hashlib.sha256(NAME.encode() + b"\n\x04" + public).digest()[:4]
    assert int.from_bytes(raw[4:12], "big") == 1679315147
    message = b"cosignature/v1\ntime 1679315147\n" + body.encode()
    WITNESS_KEY.public_key().verify(raw[12:], message)  # raises if not
    assert (
        witness.cosignature_open(
            line, body=body, name=NAME, public=WITNESS_KEY.public_key()
        )
        == 1679315147
    )
    vkey = witness.verifier_key(NAME, WITNESS_KEY.public_key())
    assert vkey.split("+", 2)[2] == base64.b64encode(b"\x04" + public).decode()
    assert witness.verifier_key_parse(vkey)[0] == NAME


@pytest.mark.parametrize(
    "change",
    ["another body", "another timestamp", "another key", "a flipped bit"],
)
def test_a_cosignature_that_is_not_the_witnesss_on_this_body_is_refused(change):
    body = f"{ORIGIN}\n5\n{base64.b64encode(bytes(32)).decode()}\n"
    line = witness.cosign(body=body, name=NAME, private=WITNESS_KEY, timestamp=100)
    raw = bytearray(base64.b64decode(line.split(" ")[2]))
    if change == "another body":
        body = body.replace("\n5\n", "\n6\n")
    elif change == "another timestamp":
        raw[4:12] = (99).to_bytes(8, "big")
    elif change == "another key":
        other = Ed25519PrivateKey.generate()
        raw = bytearray(
            base64.b64decode(
                witness.cosign(
                    body=body, name=NAME, private=other, timestamp=100
                ).split(" ")[2]
            )
        )
    else:
        raw[40] ^= 4
    forged = f"\N{EM DASH} {NAME} {base64.b64encode(bytes(raw)).decode()}\n"
    with pytest.raises(witness.CosignatureError):
        witness.cosignature_open(
            forged, body=body, name=NAME, public=WITNESS_KEY.public_key()
        )


def test_the_witness_cosigns_a_consistent_sequence_and_keeps_it_in_a_file(
    made, tree, tmp_path
):
    first = made.add_checkpoint(_request(0, [], _note(tree, 10)))
    assert first.status == 200
    body = _note(tree, 10).rpartition("\n\n")[0] + "\n"
    assert (
        witness.cosignature_open(
            first.body, body=body, name=NAME, public=WITNESS_KEY.public_key()
        )
        == 1_700_000_000
    )
    second = made.add_checkpoint(
        _request(10, tree.consistency_proof(10, 25), _note(tree, 25))
    )
    assert second.status == 200
    # Its state is a file outside any database: a new process reads it back.
    again = witness.Witness(
        name=NAME,
        private=WITNESS_KEY,
        state=witness.WitnessState(tmp_path / "state"),
        log_keys=[LOG_KEY.public_key()],
    )
    stored = again.latest(witness.origin_hash(ORIGIN))
    assert stored.status == 200 and "\n25\n" in stored.body
    assert second.body in stored.body  # with the witness's cosignature
    assert list((tmp_path / "state").iterdir()) == [made.state.path(ORIGIN)]


def test_each_refusal_the_spec_names(made, tree):
    assert made.add_checkpoint(_request(0, [], _note(tree, 10))).status == 200
    # 409: the old size is not the last one cosigned; the body says which.
    conflict = made.add_checkpoint(
        _request(5, tree.consistency_proof(5, 20), _note(tree, 20))
    )
    assert (conflict.status, conflict.body) == (409, "10\n")
    assert conflict.content_type == "text/x.tlog.size"
    # 422: a proof that does not verify, or a rewritten tree at the same size.
    bad = tree.consistency_proof(10, 20)
    bad[0] = bytes(32)
    assert made.add_checkpoint(_request(10, bad, _note(tree, 20))).status == 422
    rewritten = merkle.Tree([merkle.leaf_hash(b"x" * 32)] * 40)
    assert made.add_checkpoint(_request(10, [], _note(rewritten, 10))).status == 422
    assert (
        made.add_checkpoint(
            _request(10, rewritten.consistency_proof(10, 20), _note(rewritten, 20))
        ).status
        == 422
    )
    # 403: no signature by a trusted key, or a trusted key's that does not verify.
    stranger = Ed25519PrivateKey.generate()
    proof = tree.consistency_proof(10, 20)
    assert (
        made.add_checkpoint(_request(10, proof, _note(tree, 20, stranger))).status
        == 403
    )
    tampered = _note(tree, 20).replace("\n20\n", "\n21\n", 1)
    assert made.add_checkpoint(_request(10, proof, tampered)).status == 403
    # 404: a log it does not witness; 400: old size above the checkpoint's.
    foreign = _note(tree, 20).replace(tlog.ORIGIN_PREFIX, "example.com/other/")
    assert made.add_checkpoint(_request(10, proof, foreign)).status == 404
    assert made.add_checkpoint(_request(30, [], _note(tree, 20))).status == 400
    assert made.add_checkpoint(b"old 01\n\n" + _note(tree, 20).encode()).status == 400
    assert made.add_checkpoint(b"not a request").status == 400
    # None of that moved its state.
    assert "\n10\n" in made.state.latest(ORIGIN)


def test_old_size_zero_needs_an_empty_proof_and_an_empty_tree_its_root(made, tree):
    one = made.add_checkpoint(_request(0, [bytes(32)], _note(tree, 10)))
    assert one.status == 422
    empty = tlog.checkpoint_body(origin=ORIGIN, size=0, root=bytes(32))
    line = tlog.signature_line(
        ORIGIN, LOG_KEY.public_key(), LOG_KEY.sign(empty.encode())
    )
    assert made.add_checkpoint(_request(0, [], f"{empty}\n{line}")).status == 422


def test_two_racing_submissions_never_roll_the_state_back(made, tree):
    """The spec's race: the check of the old size and the write are one step."""
    assert made.add_checkpoint(_request(0, [], _note(tree, 5))).status == 200
    answers: list[int] = []

    def submit(size: int) -> None:
        request = _request(5, tree.consistency_proof(5, size), _note(tree, size))
        answers.append(made.add_checkpoint(request).status)

    threads = [threading.Thread(target=submit, args=(s,)) for s in (12, 30) * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers).count(200) == 1 and answers.count(409) == 7
    stored = made.state.latest(ORIGIN)
    assert "\n12\n" in stored or "\n30\n" in stored


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "witness.test/w1 http://127.0.0.1:1",  # no key
        "witness.test/w1+00000000+AAAA http://127.0.0.1:1",  # not a 0x04 key
        f"{witness.verifier_key(NAME, WITNESS_KEY.public_key()).replace('+', '+0', 1)}",
        f"{witness.verifier_key(NAME, WITNESS_KEY.public_key())} ftp://host",
    ],
    # The key is random: fixed ids, so every process collects the same tests.
    ids=["empty", "no-key", "not-a-0x04-key", "bad-key-hash", "not-http"],
)
def test_a_malformed_witness_setting_is_refused(entry):
    from audit import witness_client

    with pytest.raises(witness_client.WitnessConfigError):
        witness_client.witness_parse(entry)


def test_a_witness_setting_names_key_and_url():
    from audit import witness_client

    vkey = witness.verifier_key(NAME, WITNESS_KEY.public_key())
    config = witness_client.witness_parse(f"{vkey} http://127.0.0.1:7380/")
    assert (config.name, config.url) == (NAME, "http://127.0.0.1:7380")
    assert witness.verifier_key(config.name, config.public) == vkey


def test_the_standalone_witness_runs_without_django_settings_and_cosigns(tmp_path):
    """``python -m audit.witness``: what a third party runs, with no portal
    settings and no database, trusting the log key it is given."""
    import os
    import subprocess
    import sys

    import httpx
    from cryptography.hazmat.primitives import serialization

    from tests.support.net import free_port

    log_pub = tmp_path / "log.pub"
    log_pub.write_bytes(
        LOG_KEY.public_key().public_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PublicFormat.SubjectPublicKeyInfo,
        )
    )
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "PORTAL"))
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    process = subprocess.Popen(
        [sys.executable, "-m", "audit.witness", "--name", NAME,
         "--state-dir", str(tmp_path / "state"), "--key-file", str(tmp_path / "w.pem"),
         "--log-key", str(log_pub), "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith(f"witness {NAME} on ")
        vkey = process.stdout.readline().removeprefix("key ").strip()
        name, public = witness.verifier_key_parse(vkey)
        tree = merkle.Tree([merkle.leaf_hash(bytes([i]) * 32) for i in range(3)])
        answer = httpx.post(
            f"http://127.0.0.1:{port}/add-checkpoint",
            content=_request(0, [], _note(tree, 3)),
        )
        assert answer.status_code == 200
        body = _note(tree, 3).rpartition("\n\n")[0] + "\n"
        assert witness.cosignature_open(
            answer.text, body=body, name=name, public=public
        )
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()
    assert process.returncode == 0
