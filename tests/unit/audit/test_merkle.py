"""RFC 9162 §2.1 trees and proofs: published vectors, then forged proofs refused.

The vectors are transparency-dev/merkle's (``merkle_vectors.json`` names the file);
its trees hash as RFC 6962, which RFC 9162 keeps. The adversarial half follows the
same project's corruptions (wrong index or size, flipped bits, extra or missing
nodes) and adds swapped siblings, another leaf's proof and non-extending trees.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from audit import merkle

VECTORS = json.loads((Path(__file__).parent / "merkle_vectors.json").read_text())
LEAVES = [bytes.fromhex(leaf) for leaf in VECTORS["leaves"]]
ROOTS = [bytes.fromhex(root) for root in VECTORS["roots"]]
TREE = merkle.Tree([merkle.leaf_hash(leaf) for leaf in LEAVES])


def _hashes(items: list[str]) -> list[bytes]:
    return [bytes.fromhex(item) for item in items]


def test_the_empty_tree_hashes_as_sha256_of_nothing():
    assert merkle.Tree([]).root().hex() == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


@pytest.mark.parametrize("size", range(1, 9))
def test_roots_match_the_published_ones(size):
    assert TREE.root(size) == ROOTS[size - 1]


@pytest.mark.parametrize("vector", VECTORS["inclusion"], ids=str)
def test_inclusion_proofs_match_and_verify(vector):
    index, size = vector["leaf"] - 1, vector["size"]
    proof = _hashes(vector["proof"])
    assert TREE.inclusion_proof(index, size) == proof
    merkle.verify_inclusion(
        leaf=merkle.leaf_hash(LEAVES[index]),
        index=index,
        size=size,
        proof=proof,
        root=ROOTS[size - 1],
    )


@pytest.mark.parametrize("vector", VECTORS["consistency"], ids=str)
def test_consistency_proofs_match_and_verify(vector):
    old, new = vector["size1"], vector["size2"]
    proof = _hashes(vector["proof"])
    assert TREE.consistency_proof(old, new) == proof
    merkle.verify_consistency(
        old_size=old,
        new_size=new,
        old_root=ROOTS[old - 1],
        new_root=ROOTS[new - 1],
        proof=proof,
    )


def _random_tree(rng: random.Random, size: int) -> merkle.Tree:
    return merkle.Tree([merkle.leaf_hash(rng.randbytes(32)) for _ in range(size)])


def test_every_proof_of_random_trees_verifies():
    # given trees of 1..70 leaves
    rng = random.Random(9162)
    for size in range(1, 71):
        tree = _random_tree(rng, size)
        for index in range(size):
            merkle.verify_inclusion(
                leaf=tree.leaf_hashes[index],
                index=index,
                size=size,
                proof=tree.inclusion_proof(index),
                root=tree.root(),
            )
        for old in range(size + 1):
            merkle.verify_consistency(
                old_size=old,
                new_size=size,
                old_root=tree.root(old),
                new_root=tree.root(),
                proof=tree.consistency_proof(old),
            )


def _inclusion_forgeries(tree, index, size):
    proof = tree.inclusion_proof(index, size)
    root = tree.root(size)
    some = bytes(range(32))
    yield "index - 1", {"index": index - 1}
    yield "index + 1", {"index": index + 1}
    yield "index ^ 2", {"index": index ^ 2}
    yield "size * 2", {"size": size * 2}
    yield "size / 2", {"size": size // 2}
    yield "wrong leaf", {"leaf": some}
    yield "empty root", {"root": merkle.EMPTY_ROOT}
    yield "trailing root", {"proof": [*proof, root]}
    yield "preceding root", {"proof": [root, *proof]}
    yield "short node", {"proof": [*proof[:-1], proof[-1][:31]] if proof else [b""]}
    for i in range(len(proof)):
        flipped = [*proof]
        flipped[i] = bytes([proof[i][0] ^ 8]) + proof[i][1:]
        yield f"bit flipped in node {i}", {"proof": flipped}
    if proof:
        yield "removed node", {"proof": proof[:-1]}
    if len(proof) > 1:
        yield "inserted node", {"proof": [proof[0], some, *proof[1:]]}
        yield "swapped siblings", {"proof": [proof[1], proof[0], *proof[2:]]}
    other = (index + 1) % size
    if other != index and tree.inclusion_proof(other, size) != proof:
        yield "another leaf's proof", {"proof": tree.inclusion_proof(other, size)}


@pytest.mark.parametrize("size", [2, 3, 5, 7, 8, 13, 16, 33])
def test_forged_inclusion_proofs_are_refused(size):
    rng = random.Random(size)
    tree = _random_tree(rng, size)
    for index in range(size):
        base = {
            "leaf": tree.leaf_hashes[index],
            "index": index,
            "size": size,
            "proof": tree.inclusion_proof(index, size),
            "root": tree.root(size),
        }
        merkle.verify_inclusion(**base)  # the honest one holds
        for _name, change in _inclusion_forgeries(tree, index, size):
            probe = {**base, **change}
            with pytest.raises(merkle.ProofError):
                merkle.verify_inclusion(**probe)


@pytest.mark.parametrize(
    ("old", "new"), [(1, 2), (2, 5), (3, 7), (4, 8), (6, 8), (5, 13), (16, 33)]
)
def test_forged_consistency_proofs_are_refused(old, new):
    rng = random.Random(old * 100 + new)
    tree = _random_tree(rng, new)
    proof = tree.consistency_proof(old, new)
    base = {
        "old_size": old,
        "new_size": new,
        "old_root": tree.root(old),
        "new_root": tree.root(new),
        "proof": proof,
    }
    merkle.verify_consistency(**base)
    some = bytes(range(32))
    forgeries = [
        {"old_size": old - 1},
        {"old_size": old + 1},
        {"new_size": new * 2},
        {"new_size": new // 2},
        {"old_size": old ^ 2},
        {"old_root": some},
        {"new_root": some},
        {"old_root": base["new_root"], "new_root": base["old_root"]},
        {"proof": []},
        {"proof": [*proof, some]},
        {"proof": [some, *proof]},
        {"proof": [proof[0], *proof]},
        {"proof": proof[:-1]},
        {"old_size": new, "new_size": old},
    ]
    for i in range(len(proof)):
        flipped = [*proof]
        flipped[i] = bytes([proof[i][0] ^ 16]) + proof[i][1:]
        forgeries.append({"proof": flipped})
    if len(proof) > 1:
        forgeries.append({"proof": [proof[1], proof[0], *proof[2:]]})
    for change in forgeries:
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(**{**base, **change})


def test_a_tree_that_does_not_extend_the_old_one_has_no_proof():
    # given two trees that share a size but differ in one old leaf
    rng = random.Random(6962)
    honest = _random_tree(rng, 20)
    rewritten = merkle.Tree(
        [*honest.leaf_hashes[:4], bytes(32), *honest.leaf_hashes[5:]]
    )
    # then the rewritten tree's own proof does not join the honest old root to it
    for old in range(5, 20):
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(
                old_size=old,
                new_size=20,
                old_root=honest.root(old),
                new_root=rewritten.root(),
                proof=rewritten.consistency_proof(old),
            )


def test_the_compact_range_gives_the_trees_root_at_every_size():
    # given leaves appended in uneven batches
    rng = random.Random(1)
    tree = _random_tree(rng, 300)
    peaks: list[bytes] = []
    size = 0
    while size < 300:
        batch = tree.leaf_hashes[size : size + rng.randint(1, 17)]
        peaks, size = merkle.compact_extend(peaks, size, batch)
        # then the root from the peaks alone is the full tree's
        assert merkle.compact_root(peaks) == tree.root(size)
    with pytest.raises(ValueError, match="peaks"):
        merkle.compact_extend(peaks[:-1], size, [])
