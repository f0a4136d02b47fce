"""Random tamper trials against the transparency log's checks (issue 19 §4).

As tests/unit/audit/test_chain_trials.py does for the chain: 100 random trials per
class, each built honestly first (it must verify), then changed once and caught with
its kind. The classes: the log's tail cut after a signed head, a head that does not
extend the one before it (audit/verify_log.py, as ``verify_audit`` runs it); a forged
inclusion proof and a forged consistency proof (audit/merkle.py, and the offline
verifier's own copy of the inclusion check); an edited bundle section
(tools/verify_bundle.py on a bundle built here: events, checkpoint and log signed
with a test key).
"""

from __future__ import annotations

import copy
import datetime as dt
import random
import uuid
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import chain, checkpoints, evidence, merkle, tlog, verify, verify_log
from audit.models import Checkpoint, TreeHead
from tests.support.evidence import load_tool

tool = load_tool()
TRIALS = 100
TENANT = uuid.UUID(int=7)
NOW = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)
KEY = Ed25519PrivateKey.generate()
SIGNER = checkpoints.SigningKey(
    private=KEY, key_id=checkpoints.key_id_of(KEY.public_key())
)
KEYS = {SIGNER.key_id: KEY.public_key()}


def _leaves(rng: random.Random, n: int) -> list[bytes]:
    return [rng.randbytes(32) for _ in range(n)]


def _head(leaves: list[bytes], size: int) -> TreeHead:
    """A head signed by the one signer's note format over the first ``size``."""
    tree = merkle.Tree([merkle.leaf_hash(leaf) for leaf in leaves])
    root = tree.root(size)
    body = tlog.checkpoint_body(origin=tlog.origin_of(TENANT), size=size, root=root)
    return TreeHead(
        tenant_id=TENANT,
        size=size,
        root_hash=root.hex(),
        note=checkpoints.tree_note_sign(body=body, key=SIGNER),
        signed_at=NOW,
        key_id=SIGNER.key_id,
    )


def _log_verdict(heads: list[TreeHead], leaves: list[bytes]) -> str | None:
    for head in heads:
        if not verify_log.head_opens(head, KEYS):
            return verify.FORGED_CHECKPOINT
    tree = merkle.Tree([merkle.leaf_hash(leaf) for leaf in leaves])
    broken = verify_log._heads_against_tree(heads, tree)
    return broken.kind if broken else None


def _log_trial(kind: str, seed: int) -> tuple[str | None, str | None]:
    rng = random.Random(seed)
    n = rng.randint(3, 300)
    leaves = _leaves(rng, n)
    sizes = sorted(rng.sample(range(1, n + 1), rng.randint(2, min(5, n))))
    heads = [_head(leaves, size) for size in sizes]
    before = _log_verdict(heads, leaves)
    if kind == verify.DELETED:  # the log's tail cut after the newest head
        leaves = leaves[: rng.randrange(0, sizes[-1])]
    else:  # the newest head signed over a log rewritten below the one before it
        changed = list(leaves)
        changed[rng.randrange(0, sizes[-2])] = rng.randbytes(32)
        heads[-1] = _head(changed, sizes[-1])
        leaves = changed
    return before, _log_verdict(heads, leaves)


@pytest.mark.parametrize("kind", [verify.DELETED, verify_log.FORKED])
def test_every_log_trial_is_caught_with_its_kind(kind):
    outcomes = [_log_trial(kind, seed) for seed in range(TRIALS)]
    assert all(before is None for before, _ in outcomes)
    assert [after for _, after in outcomes] == [kind] * TRIALS


def _forged_inclusion(rng: random.Random, tree: merkle.Tree, index: int) -> dict:
    size = len(tree)
    proof = tree.inclusion_proof(index)
    honest = {
        "leaf": tree.leaf_hashes[index],
        "index": index,
        "size": size,
        "proof": proof,
    }
    choices = ["bit", "other leaf", "index", "drop", "extra", "wrong leaf"]
    if len(proof) > 1:
        choices.append("swap")
    how = rng.choice(choices)
    if how == "bit" and proof:
        i = rng.randrange(len(proof))
        node = bytearray(proof[i])
        node[rng.randrange(32)] ^= 1 << rng.randrange(8)
        return {**honest, "proof": [*proof[:i], bytes(node), *proof[i + 1 :]]}
    if how == "swap":
        i = rng.randrange(len(proof) - 1)
        swapped = [*proof]
        swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
        if swapped != proof:
            return {**honest, "proof": swapped}
    if how == "other leaf" or (how == "index" and size > 1):
        other = rng.choice([i for i in range(size) if i != index])
        if how == "other leaf":  # another leaf's (honest) proof, this leaf
            return {**honest, "proof": tree.inclusion_proof(other)}
        return {**honest, "index": other}
    if how == "drop" and proof:
        return {**honest, "proof": proof[:-1]}
    if how == "extra":
        return {**honest, "proof": [*proof, rng.randbytes(32)]}
    return {**honest, "leaf": merkle.leaf_hash(rng.randbytes(32))}


def test_every_forged_inclusion_proof_is_refused_by_both_verifiers():
    refused = 0
    for seed in range(TRIALS):
        rng = random.Random(seed)
        tree = merkle.Tree(
            [merkle.leaf_hash(leaf) for leaf in _leaves(rng, rng.randint(2, 200))]
        )
        index = rng.randrange(len(tree))
        root = tree.root()
        honest = {
            "leaf": tree.leaf_hashes[index],
            "index": index,
            "size": len(tree),
            "proof": tree.inclusion_proof(index),
        }
        merkle.verify_inclusion(**honest, root=root)
        assert tool.inclusion_root(**honest) == root
        forged = _forged_inclusion(rng, tree, index)
        with pytest.raises(merkle.ProofError):
            merkle.verify_inclusion(**forged, root=root)
        assert tool.inclusion_root(**forged) != root
        refused += 1
    assert refused == TRIALS


def test_every_forged_consistency_proof_is_refused():
    for seed in range(TRIALS):
        rng = random.Random(seed)
        new = rng.randint(2, 200)
        old = rng.randint(1, new - 1)
        tree = merkle.Tree([merkle.leaf_hash(leaf) for leaf in _leaves(rng, new)])
        proof = tree.consistency_proof(old, new)
        honest = {
            "old_size": old,
            "new_size": new,
            "old_root": tree.root(old),
            "new_root": tree.root(new),
            "proof": proof,
        }
        merkle.verify_consistency(**honest)
        how = rng.choice(["bit", "drop", "extra", "old root", "swap", "fork"])
        if how == "bit":
            i = rng.randrange(len(proof))
            node = bytearray(proof[i])
            node[rng.randrange(32)] ^= 1 << rng.randrange(8)
            forged = {**honest, "proof": [*proof[:i], bytes(node), *proof[i + 1 :]]}
        elif how == "drop":
            forged = {**honest, "proof": proof[:-1]}
        elif how == "extra":
            forged = {**honest, "proof": [*proof, rng.randbytes(32)]}
        elif how == "old root":
            forged = {**honest, "old_root": rng.randbytes(32)}
        elif how == "swap" and len(proof) > 1 and proof[0] != proof[1]:
            forged = {**honest, "proof": [proof[1], proof[0], *proof[2:]]}
        else:  # a new tree that rewrote an old leaf, with its own honest proof
            leaves = list(tree.leaf_hashes)
            leaves[rng.randrange(old)] = merkle.leaf_hash(rng.randbytes(32))
            fork = merkle.Tree(leaves)
            forged = {
                **honest,
                "new_root": fork.root(),
                "proof": fork.consistency_proof(old),
            }
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(**forged)


# --- Bundles ------------------------------------------------------------------------


def _event(rng: random.Random, task_id: uuid.UUID, n: int, prev: str | None) -> dict:
    code = rng.choice(["task.transitioned", "task.resolved", "operation.approved"])
    payload = {"n": n, "resolution": rng.choice(["done", "retry"]), "note": "é" * n}
    content = chain.event_content(
        event_id=uuid.UUID(int=rng.getrandbits(128)), tenant_id=TENANT,
        task_id=task_id, operation_id=None, code=code, actor_type="person",
        actor_id=f"p{rng.randint(1, 9)}", reason_code=None, contract_key=None,
        contract_version=None, payload=payload, trace_id="", span_id="",
        created_at=(NOW + dt.timedelta(seconds=n)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )  # fmt: skip
    # chain.event_content makes format v1 (the payload inside the content)
    return {
        "seq": n,
        "prev_hash": prev,
        "hash": chain.event_hash(prev_hash=prev, content=content),
        "content": content,
    }


def _bundle(rng: random.Random) -> dict[str, Any]:
    """A bundle as tasks/evidence.py builds one: the chain, its checkpoint, the log
    head with each event's inclusion proof, derived and uncovered sections."""
    task_id = uuid.UUID(int=rng.getrandbits(128))
    events: list[dict] = []
    for n in range(1, rng.randint(2, 12) + 1):
        events.append(_event(rng, task_id, n, events[-1]["hash"] if events else None))
    head = events[-1]
    signed = Checkpoint(
        tenant_id=TENANT, task_id=task_id, head_seq=head["seq"],
        head_event_id=uuid.UUID(head["content"]["id"]), head_hash=head["hash"],
        event_count=len(events), signed_at=NOW, key_id=SIGNER.key_id,
    )  # fmt: skip
    signed.signature = KEY.sign(checkpoints.checkpoint_message(signed)).hex()
    # the tenant's log: other chains' events around this chain's
    leaves = _leaves(rng, rng.randint(0, 40))
    positions: dict[str, int] = {}
    for event in events:
        at = rng.randint(max(positions.values(), default=-1) + 1, len(leaves))
        leaves.insert(at, bytes.fromhex(event["hash"]))
        positions[event["content"]["id"]] = at
    tree = merkle.Tree([merkle.leaf_hash(leaf) for leaf in leaves])
    note = _head(leaves, len(leaves)).note
    decisions = [
        {
            "seq": e["seq"], "event_id": e["content"]["id"], "code": e["content"]["code"],
            "by": {"actor_type": "person", "actor_id": e["content"]["actor_id"]},
            "at": e["content"]["created_at"], "operation_id": None, "reason_code": None,
            "resolution": e["content"]["payload"]["resolution"],
            "note": e["content"]["payload"]["note"],
        }
        for e in events
        if e["content"]["code"] in tool.DECISION_CODES
    ]  # fmt: skip
    return {
        "format": tool.BUNDLE_FORMAT,
        "version": 2,
        "exported_at": "2026-12-04T12:00:00.000000Z",
        "tenant": {"id": str(TENANT), "slug": "t"},
        "task": {"id": str(task_id), "state": "succeeded"},
        "operations": [
            {"id": str(uuid.uuid4()), "state": "verified", "result": {"ok": 1}}
        ],
        "takeover_decisions": decisions,
        "chain": {
            "kind": "task",
            "tenant_id": str(TENANT),
            "task_id": str(task_id),
            "hash": "sha256",
            "length": len(events),
            "head_hash": head["hash"],
            "anchor": None,
            "events": events,
        },
        "checkpoint": evidence.checkpoint_json(signed),
        "log": {
            "checkpoint": note,
            "inclusion": [
                {
                    "event_id": event_id,
                    "index": index,
                    "proof": [p.hex() for p in tree.inclusion_proof(index)],
                }
                for event_id, index in positions.items()
            ],
        },
        "coverage": {"complete": True},
    }


def _bundle_verdict(bundle: dict[str, Any]) -> Any:
    try:
        return tool.verify_bundle(copy.deepcopy(bundle), KEYS)
    except tool.Failure as failure:
        return failure.kind


def _flip_hex(text: str, rng: random.Random) -> str:
    i = rng.randrange(len(text))
    return text[:i] + ("0" if text[i] != "0" else "1") + text[i + 1 :]


def _edit(bundle: dict[str, Any], rng: random.Random) -> str:
    """Edit one covered place at random; returns the kind it must be caught as."""
    events = bundle["chain"]["events"]
    how = rng.choice(
        ["event", "payload", "decision", "length", "proof", "index", "note", "signed"]
    )
    if how == "decision" and not bundle["takeover_decisions"]:
        how = "event"
    if how == "event":
        event = rng.choice(events)
        column = rng.choice(["actor_id", "code", "created_at", "operation_id"])
        event["content"][column] = "edited"
        return tool.ALTERED
    if how == "payload":
        rng.choice(events)["content"]["payload"]["note"] = "edited"
        return tool.ALTERED
    if how == "decision":
        decision = rng.choice(bundle["takeover_decisions"])
        decision[rng.choice(["resolution", "note", "at", "code"])] = "edited"
        return tool.ALTERED
    if how == "length":
        bundle["chain"]["length"] += rng.choice([-1, 1])
        return tool.ALTERED
    entry = rng.choice(bundle["log"]["inclusion"])
    if how == "proof" and entry["proof"]:
        i = rng.randrange(len(entry["proof"]))
        entry["proof"][i] = _flip_hex(entry["proof"][i], rng)
        return tool.FORGED_PROOF
    if how in ("proof", "index"):
        entry["index"] += 1
        return tool.FORGED_PROOF
    if how == "note":
        body, _, signatures = bundle["log"]["checkpoint"].partition("\n\n")
        origin, size, root = body.split("\n")
        root = tlog.base64.b64encode(bytes(32)).decode()
        bundle["log"]["checkpoint"] = f"{origin}\n{size}\n{root}\n\n{signatures}"
        return tool.FORGED_CHECKPOINT
    bundle["checkpoint"]["event_count"] += 1
    return tool.FORGED_CHECKPOINT


def test_every_edited_bundle_section_is_caught_with_its_kind():
    # given honest bundles: intact, every event proven in the signed log head, and
    # the sections nobody signs named
    caught = []
    for seed in range(TRIALS):
        rng = random.Random(seed)
        bundle = _bundle(rng)
        intact = _bundle_verdict(bundle)
        assert isinstance(intact, tool.Intact), intact
        assert intact.logged == len(bundle["chain"]["events"])
        assert {"operations", "task", "tenant", "coverage"} <= set(intact.not_checked)
        # when one covered place is edited
        expected = _edit(bundle, rng)
        # then it is caught with its kind
        caught.append((expected, _bundle_verdict(bundle)))
    assert all(expected == got for expected, got in caught), caught


def test_an_edited_uncovered_section_is_named_not_passed_as_intact():
    # given an honest bundle whose operations section is then edited
    bundle = _bundle(random.Random(1))
    bundle["operations"][0]["state"] = "failed"
    # then the verdict names operations among what no signature covers
    intact = _bundle_verdict(bundle)
    assert "operations" in intact.not_checked
    assert "not covered (no signature vouches for them, not checked): " in str(intact)
    assert "operations" in str(intact).splitlines()[-1]


def test_the_tools_copies_match_the_portals():
    assert tool.LOG_ORIGIN_PREFIX == tlog.ORIGIN_PREFIX
    from tasks.evidence import DECISION_CODES

    assert {str(code) for code in DECISION_CODES} == tool.DECISION_CODES
