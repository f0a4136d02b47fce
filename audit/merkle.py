"""RFC 9162 (Certificate Transparency 2.0) §2.1 Merkle trees, proofs and their checks.

The tree hashing is RFC 6962's, unchanged in RFC 9162: a leaf hash is
``SHA-256(0x00 || leaf)``, an interior node ``SHA-256(0x01 || left || right)``, the
empty tree's hash ``SHA-256("")``; a tree of ``n > 1`` leaves splits at ``k``, the
largest power of two below ``n``. The proofs are the RFC's ``PATH`` (inclusion,
§2.1.3.1) and ``PROOF`` (consistency, §2.1.4.1) and are checked by its
algorithms (§2.1.3.2, §2.1.4.2). The transparency log (audit/tlog.py) keeps one tree
per tenant whose leaves are the events' chain hashes in log order.

Pure standard library, no Django: the verifying half is what a third party runs.
``tests/unit/audit/test_merkle.py`` checks it against published vectors
(transparency-dev/merkle) and against forged proofs.

Cost: ``Tree`` keeps the leaf hashes (32 bytes each) and memoises the root of every
complete, aligned subtree it has hashed, so the first root of a tree of ``n`` leaves
costs ``n - 1`` node hashes and, after it, each proof about ``log2 n`` lookups.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(ValueError):
    """A proof that does not verify (wrong length, wrong hashes, impossible sizes)."""


def leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


class Tree:
    """The Merkle tree over ``leaf_hashes`` (already ``leaf_hash``-ed), in order."""

    def __init__(self, leaf_hashes: Sequence[bytes]) -> None:
        self.leaf_hashes = leaf_hashes
        self._complete: dict[tuple[int, int], bytes] = {}

    def __len__(self) -> int:
        return len(self.leaf_hashes)

    def _hash(self, lo: int, hi: int) -> bytes:
        """MTH of leaves ``[lo, hi)``."""
        n = hi - lo
        if n == 0:
            return EMPTY_ROOT
        if n == 1:
            return self.leaf_hashes[lo]
        complete = n & (n - 1) == 0 and lo % n == 0
        if complete and (lo, n) in self._complete:
            return self._complete[(lo, n)]
        k = _split(n)
        value = node_hash(self._hash(lo, lo + k), self._hash(lo + k, hi))
        if complete:
            self._complete[(lo, n)] = value
        return value

    def root(self, size: int | None = None) -> bytes:
        """MTH of the first ``size`` leaves (all of them by default)."""
        size = len(self) if size is None else size
        if not 0 <= size <= len(self):
            raise ValueError(f"size {size} outside 0..{len(self)}")
        return self._hash(0, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """RFC 9162 ``PATH(index, D[0:size])``, leaf to root."""
        size = len(self) if size is None else size
        if not 0 <= index < size <= len(self):
            raise ValueError(f"no leaf {index} in a tree of {size}")
        return self._path(index, 0, size)

    def _path(self, m: int, lo: int, hi: int) -> list[bytes]:
        n = hi - lo
        if n == 1:
            return []
        k = _split(n)
        if m < k:
            return [*self._path(m, lo, lo + k), self._hash(lo + k, hi)]
        return [*self._path(m - k, lo + k, hi), self._hash(lo, lo + k)]

    def consistency_proof(self, old: int, new: int | None = None) -> list[bytes]:
        """RFC 9162 ``PROOF(old, D[0:new])``; empty when ``old`` is 0 or ``new``."""
        new = len(self) if new is None else new
        if not 0 <= old <= new <= len(self):
            raise ValueError(f"no consistency proof from {old} to {new}")
        if old == 0 or old == new:
            return []
        return self._subproof(old, 0, new, True)

    def _subproof(self, m: int, lo: int, hi: int, whole: bool) -> list[bytes]:
        n = hi - lo
        if m == n:
            return [] if whole else [self._hash(lo, hi)]
        k = _split(n)
        if m <= k:
            return [*self._subproof(m, lo, lo + k, whole), self._hash(lo + k, hi)]
        return [*self._subproof(m - k, lo + k, hi, False), self._hash(lo, lo + k)]


def verify_inclusion(
    *, leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """RFC 9162 §2.1.3.2: ``leaf`` (a leaf hash) is at ``index`` of the tree of
    ``size`` leaves whose root is ``root``.

    Raises:
        ProofError: it is not (or the proof is malformed).
    """
    if not 0 <= index < size:
        raise ProofError(f"index {index} is not in a tree of {size}")
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if len(p) != 32 or sn == 0:
            raise ProofError("the inclusion proof is too long or malformed")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof is too short")
    if r != root:
        raise ProofError("the inclusion proof does not lead to the root")


def verify_consistency(
    *,
    old_size: int,
    new_size: int,
    old_root: bytes,
    new_root: bytes,
    proof: Sequence[bytes],
) -> None:
    """RFC 9162 §2.1.4.2: the tree of ``new_size`` leaves with ``new_root`` extends
    the one of ``old_size`` leaves with ``old_root``.

    Raises:
        ProofError: it does not (or the proof is malformed).
    """
    if not 0 <= old_size <= new_size:
        raise ProofError(f"a tree of {new_size} cannot extend one of {old_size}")
    if old_size == new_size:
        if proof:
            raise ProofError("a consistency proof between equal sizes must be empty")
        if old_root != new_root:
            raise ProofError("two heads of one size with different roots")
        return
    if old_size == 0:
        if proof:
            raise ProofError("a consistency proof from the empty tree must be empty")
        return
    if not proof or any(len(p) != 32 for p in proof):
        raise ProofError("the consistency proof is empty or malformed")
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is a node
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is too short")
    if fr != old_root:
        raise ProofError("the consistency proof does not give the old root")
    if sr != new_root:
        raise ProofError("the consistency proof does not give the new root")


def compact_extend(
    peaks: Sequence[bytes], size: int, leaf_hashes: Iterable[bytes]
) -> tuple[list[bytes], int]:
    """Append leaves to a tree known only by its compact range.

    ``peaks`` are the roots of the complete subtrees that ``size`` decomposes into
    (one per set bit, largest first): all a writer needs to extend the tree and
    take its root, without its leaves. Returns the new peaks and size.
    """
    stack = list(peaks)
    if len(stack) != size.bit_count():
        raise ValueError(f"{len(stack)} peaks cannot describe a tree of {size}")
    for leaf in leaf_hashes:
        node, carry = leaf, size
        while carry & 1:
            node = node_hash(stack.pop(), node)
            carry >>= 1
        stack.append(node)
        size += 1
    return stack, size


def compact_root(peaks: Sequence[bytes]) -> bytes:
    """The RFC 9162 root of the tree whose compact range is ``peaks``."""
    if not peaks:
        return EMPTY_ROOT
    root = peaks[-1]
    for peak in reversed(peaks[:-1]):
        root = node_hash(peak, root)
    return root
