"""Random tamper trials against the verifier's chain checks (RELIABILITY S09 sizing).

The database tests (tests/db/test_audit_chain.py) make each kind of change once, as a
superuser, through ``verify_audit``. Here the same checks run on chains built in
memory, 100 random trials per class (random length, checkpoint and position), so the
detection rate per class is measured, not assumed. Each trial must be caught with
its kind.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import uuid
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import chain, checkpoints, verify
from audit.models import Checkpoint

TRIALS = 100
TENANT = uuid.UUID(int=1)
NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
KEY = Ed25519PrivateKey.generate()
KEY_ID = checkpoints.key_id_of(KEY.public_key())


def _content(rng: random.Random, task_id: uuid.UUID, n: int) -> dict[str, Any]:
    return chain.event_content(
        event_id=uuid.UUID(int=rng.getrandbits(128)), tenant_id=TENANT,
        task_id=task_id, operation_id=None, code="task.transitioned",
        actor_type="agent", actor_id=f"agent-{rng.randint(1, 9)}", reason_code=None,
        contract_key=None, contract_version=None,
        payload={"n": n, "v": rng.random(), "s": "é" * rng.randint(0, 3)},
        trace_id="", span_id="",
        created_at=(NOW + dt.timedelta(seconds=n)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )  # fmt: skip


def _row(content: dict[str, Any], seq: int, prev: str | None) -> verify._Row:
    return verify._Row(
        id=uuid.UUID(content["id"]),
        task_id=uuid.UUID(content["task_id"]),
        content=content,
        created_at=NOW + dt.timedelta(seconds=seq),
        seq=seq,
        prev_hash=prev,
        hash=chain.event_hash(prev_hash=prev, content=content),
    )


def _relink(rows: list[verify._Row], start: int) -> None:
    """Renumber from ``start`` on (the attacker closing gaps), links untouched."""
    for i in range(start, len(rows)):
        rows[i] = dataclasses.replace(rows[i], seq=i + 1)


def _sign(row: verify._Row, count: int, **changes: Any) -> Checkpoint:
    fields: dict[str, Any] = {
        "tenant_id": TENANT,
        "task_id": row.task_id,
        "head_seq": row.seq,
        "head_event_id": row.id,
        "head_hash": row.hash,
        "event_count": count,
        "signed_at": NOW + dt.timedelta(hours=1),
        "key_id": KEY_ID,
    }
    signature = KEY.sign(checkpoints.signed_message(**fields)).hex()
    return Checkpoint(signature=signature, **{**fields, **changes})


def _verdict(rows: list[verify._Row], checkpoint: Checkpoint) -> str | None:
    if not checkpoints.signature_valid(
        checkpoint, public_keys={KEY_ID: KEY.public_key()}
    ):
        return verify.FORGED_CHECKPOINT
    broken = (
        verify._walk(rows, "task")
        or verify._against_checkpoint(rows, checkpoint, "task", None)[0]
    )
    return broken.kind if broken else None


def _trial(kind: str, seed: int) -> tuple[str | None, str | None]:
    """Build a chain, sign it, tamper once; (verdict before, verdict after)."""
    rng = random.Random(seed)
    task_id = uuid.UUID(int=rng.getrandbits(128))
    length = rng.randint(4, 20)
    rows: list[verify._Row] = []
    for seq in range(1, length + 1):
        rows.append(
            _row(_content(rng, task_id, seq), seq, rows[-1].hash if rows else None)
        )
    signed_upto = rng.randint(3, length)
    checkpoint = _sign(rows[signed_upto - 1], signed_upto)
    before = _verdict(rows, checkpoint)
    k = rng.randrange(0, signed_upto - 1)  # a position inside the signed part
    if kind == verify.ALTERED:
        column = rng.choice(["payload", "actor_id", "code", "created_at", "id"])
        changed = {**rows[k].content, column: rng.choice(["x", "task.claimed", {}])}
        rows[k] = dataclasses.replace(rows[k], content=changed)
    elif kind == verify.DELETED:
        if rng.random() < 0.5:  # a middle event, the gap closed or not
            del rows[k + 1 if k + 1 < signed_upto - 1 else k]
            if rng.random() < 0.5:
                _relink(rows, k)
        else:  # the tail cut after the checkpoint
            del rows[rng.randrange(1, signed_upto) :]
    elif kind == verify.INSERTED:
        forged = _content(rng, task_id, 999)
        prev = rows[k].hash
        rows.insert(k + 1, _row(forged, k + 2, prev))
        _relink(rows, k + 1)
    elif kind == verify.REORDERED:
        rows[k], rows[k + 1] = rows[k + 1], rows[k]
        _relink(rows, 0)
    elif kind == verify.FORGED_CHECKPOINT:
        change = rng.choice(["count", "seq", "key"])
        if change == "count":
            checkpoint = _checkpoint_with(checkpoint, event_count=1)
        elif change == "seq":
            checkpoint = _checkpoint_with(checkpoint, head_seq=1)
        else:
            other = Ed25519PrivateKey.generate()
            message = checkpoints.checkpoint_message(checkpoint)
            checkpoint = _checkpoint_with(
                checkpoint, signature=other.sign(message).hex()
            )
    return before, _verdict(rows, checkpoint)


def _checkpoint_with(checkpoint: Checkpoint, **changes: Any) -> Checkpoint:
    fields = {
        name: getattr(checkpoint, name)
        for name in (
            "tenant_id", "task_id", "head_seq", "head_event_id", "head_hash",
            "event_count", "signed_at", "key_id", "signature",
        )
    }  # fmt: skip
    return Checkpoint(**{**fields, **changes})


@pytest.mark.parametrize(
    "kind",
    [
        verify.ALTERED,
        verify.DELETED,
        verify.INSERTED,
        verify.REORDERED,
        verify.FORGED_CHECKPOINT,
    ],
)
def test_every_trial_of_a_class_is_detected_with_its_kind(kind: str) -> None:
    verdicts = [_trial(kind, seed) for seed in range(TRIALS)]
    # every untouched chain verified ...
    assert {before for before, _ in verdicts} == {None}
    # ... and every tampered one was caught, named as its class: 100 %
    detected = sum(after == kind for _, after in verdicts)
    assert detected == TRIALS, [after for _, after in verdicts if after != kind]
