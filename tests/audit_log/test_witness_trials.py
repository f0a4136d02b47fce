"""Random trials for issue 19 §4's witness and timestamp classes, 100 each.

As tests/unit/audit/test_tlog_trials.py does for the log: each trial builds an
honest case first (it must pass both verifiers), then changes it once, and both
the database side (``audit.witness_client.cosignature_check`` and
``audit.timestamp.token_check``, which ``verify_audit`` runs) and the offline
verifier's own copies (tools/verify_bundle.py) must name the kind. Cosignatures are
made by the witness's own code (audit/witness.py); tokens by a real TSA
(``openssl ts -reply``, tests/support/tsa.py). The classes:

- a forged witness cosignature: another key under the witness's name, a flipped
  bit, a changed timestamp;
- a replayed cosignature: the witness's genuine cosignature of an earlier head of
  the same log put on a later head;
- a timestamp for another head: the TSA's genuine token of one head put on another.
"""

from __future__ import annotations

import base64
import datetime as dt
import random
import uuid
from collections.abc import Iterator

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import checkpoints, merkle, timestamp, tlog, witness, witness_client
from audit.models import TreeHead
from tests.support.evidence import load_tool
from tests.support.tsa import Tsa, running_tsa

tool = load_tool()
TRIALS = 100
LOG_KEY = Ed25519PrivateKey.generate()
SIGNER = checkpoints.SigningKey(
    private=LOG_KEY, key_id=checkpoints.key_id_of(LOG_KEY.public_key())
)
NAME = "witness.test/trials"
WITNESS_KEY = Ed25519PrivateKey.generate()
CONFIG = witness_client.WitnessConfig(
    name=NAME, public=WITNESS_KEY.public_key(), url=""
)
TOOL_WITNESS = tool.load_witness_key(
    witness.verifier_key(NAME, WITNESS_KEY.public_key())
)
START = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)


def _heads(rng: random.Random, tenant: uuid.UUID) -> list[TreeHead]:
    """Two to five heads of one random log, each signed a minute or more after
    the one before (as the job signs them)."""
    n = rng.randint(2, 200)
    tree = merkle.Tree([merkle.leaf_hash(rng.randbytes(32)) for _ in range(n)])
    sizes = sorted(rng.sample(range(1, n + 1), rng.randint(2, min(5, n))))
    heads, at = [], START + dt.timedelta(seconds=rng.randint(0, 10**6))
    for size in sizes:
        body = tlog.checkpoint_body(
            origin=tlog.origin_of(tenant), size=size, root=tree.root(size)
        )
        heads.append(
            TreeHead(
                id=uuid.uuid4(),
                tenant_id=tenant,
                size=size,
                root_hash=tree.root(size).hex(),
                note=checkpoints.tree_note_sign(body=body, key=SIGNER),
                signed_at=at,
                key_id=SIGNER.key_id,
            )
        )
        at += dt.timedelta(seconds=rng.randint(61, 3600))
    return heads


def _cosign(head: TreeHead, rng: random.Random) -> str:
    """The witness's cosignature, a few seconds after the head was signed."""
    at = int(head.signed_at.timestamp()) + rng.randint(0, 5)
    return witness.cosign(
        body=witness_client.head_body(head),
        name=NAME,
        private=WITNESS_KEY,
        timestamp=at,
    )


def _db_verdict(line: str, head: TreeHead, heads: list[TreeHead]) -> str | None:
    broken = witness_client.cosignature_check(
        line,
        head=head,
        body=witness_client.head_body(head),
        config=CONFIG,
        others={h.pk: witness_client.head_body(h) for h in heads},
    )
    return broken.kind if broken else None


def _tool_verdict(line: str, head: TreeHead) -> str | None:
    """The offline verifier on the head's note with ``line``; the signed
    checkpoint it vouches for is as old as the head."""
    try:
        tool._check_cosignatures(
            head.note + line,
            [TOOL_WITNESS],
            not_before=int(head.signed_at.timestamp()),
        )
    except tool.Failure as failure:
        return failure.kind
    return None


def _forged(line: str, rng: random.Random, head: TreeHead) -> str:
    raw = bytearray(base64.b64decode(line.split(" ")[2]))
    how = rng.choice(["another key", "flipped bit", "changed time"])
    if how == "another key":
        return witness.cosign(
            body=witness_client.head_body(head),
            name=NAME,
            private=Ed25519PrivateKey.generate(),
            timestamp=int.from_bytes(raw[4:12], "big"),
        )
    if how == "flipped bit":
        raw[rng.randrange(12, 76)] ^= 1 << rng.randrange(8)
    else:  # a later time: the signature covers it
        later = int.from_bytes(raw[4:12], "big") + rng.randint(1, 10**6)
        raw[4:12] = later.to_bytes(8, "big")
    return f"\N{EM DASH} {NAME} {base64.b64encode(bytes(raw)).decode()}\n"


@pytest.mark.parametrize("kind", ["forged cosignature", "replayed cosignature"])
def test_every_forged_or_replayed_cosignature_is_caught_with_its_kind(kind):
    caught = 0
    for seed in range(TRIALS):
        rng = random.Random(f"{kind}-{seed}")
        heads = _heads(rng, uuid.UUID(int=seed + 1))
        lines = [_cosign(head, rng) for head in heads]
        target = rng.randrange(1, len(heads))
        head = heads[target]
        honest = (
            _db_verdict(lines[target], head, heads),
            _tool_verdict(lines[target], head),
        )
        assert honest == (None, None), (seed, honest)
        if kind == "forged cosignature":
            line = _forged(lines[target], rng, head)
        else:  # an earlier head's genuine cosignature, on this head
            line = lines[rng.randrange(0, target)]
        verdicts = (_db_verdict(line, head, heads), _tool_verdict(line, head))
        assert verdicts == (kind, kind), (seed, verdicts)
        caught += 1
    assert caught == TRIALS


@pytest.fixture(scope="module")
def tsa() -> Iterator[Tsa]:
    with running_tsa() as running:
        yield running


def test_every_timestamp_of_another_head_is_caught(tsa):
    roots = timestamp.roots_load(tsa.root_file.read_bytes())
    root_pem = tsa.root_file.read_bytes()
    caught = 0
    with httpx.Client() as client:
        for seed in range(TRIALS):
            rng = random.Random(f"timestamp-{seed}")
            heads = _heads(rng, uuid.UUID(int=seed + 1))
            first, second = rng.sample(heads, 2)
            bodies = [witness_client.head_body(h) for h in (first, second)]
            tokens = [timestamp.request(b, url=tsa.url, client=client) for b in bodies]
            honest = timestamp.token_check(tokens[1], body=bodies[1], roots=roots)
            tool._check_timestamps(
                {"checkpoint": second.note, "rfc3161": [_entry(tsa, tokens[1])]},
                [root_pem],
            )
            assert honest is None
            db = timestamp.token_check(tokens[0], body=bodies[1], roots=roots)
            with pytest.raises(tool.Failure) as failure:
                tool._check_timestamps(
                    {"checkpoint": second.note, "rfc3161": [_entry(tsa, tokens[0])]},
                    [root_pem],
                )
            assert db is not None and db[0] == "timestamp for another head"
            assert failure.value.kind == "timestamp for another head"
            caught += 1
    assert caught == TRIALS


def _entry(tsa: Tsa, token: bytes) -> dict[str, str]:
    return {"tsa": tsa.url, "token": base64.b64encode(token).decode()}
