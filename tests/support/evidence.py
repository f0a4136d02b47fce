"""The offline verifier, loaded from its file, and every way to tamper with a bundle.

``TAMPERS`` maps a name to a change of a parsed bundle and the kind
``tools/verify_bundle.py`` must report for it. A change that forges events gives them
valid hashes (computed as the portal would), so only the links, the numbering or the
signed checkpoint can give them away.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "verify_bundle.py"


def load_tool() -> ModuleType:
    """tools/verify_bundle.py as a module (it is a script, not a package)."""
    if "verify_bundle" in sys.modules:
        return sys.modules["verify_bundle"]
    spec = importlib.util.spec_from_file_location("verify_bundle", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tool = load_tool()

Bundle = dict[str, Any]


def run_verifier(bundle_file: Path, *keys: str | Path) -> subprocess.CompletedProcess:
    """The verifier as an auditor runs it: its own process, from another directory."""
    args = [sys.executable, "-I", str(TOOL), str(bundle_file)]
    for key in keys:
        args += ["--public-key", str(key)]
    return subprocess.run(
        args, cwd="/", capture_output=True, text=True, timeout=60, check=False
    )


def verdict(bundle: Bundle, public_pem: str) -> str:
    """``intact`` or the kind of the first failure, through the tool's own parsing."""
    data = json.dumps(bundle, ensure_ascii=False).encode()
    key_id, public = tool.load_public_key(public_pem)
    try:
        tool.verify_bundle(tool.parse_bundle(data), {key_id: public})
    except tool.Failure as failure:
        return failure.kind
    return "intact"


def _events(bundle: Bundle) -> list[dict[str, Any]]:
    return bundle["chain"]["events"]


def _set_payload(event: dict[str, Any], payload: Any) -> None:
    """Give an event a new payload as the portal would hash it: in the content
    (chain format v1) or beside it with its digest in the content (v2)."""
    if event["content"]["v"] == tool.CHAIN_FORMAT_V2:
        event["content"]["payload_digest"] = tool.payload_digest(payload)
        event["payload"] = payload
    else:
        event["content"]["payload"] = payload


def _forged_after(bundle: Bundle, index: int) -> dict[str, Any]:
    """A new event with a valid hash, linked to the event at ``index``."""
    before = _events(bundle)[index]
    content = {**before["content"], "id": str(uuid.uuid4()), "code": "task.resolved"}
    forged: dict[str, Any] = {"seq": before["seq"] + 1, "content": content}
    _set_payload(forged, {"forged": "a decision nobody made"})
    forged["prev_hash"] = before["hash"]
    forged["hash"] = tool.event_hash(prev_hash=before["hash"], content=content)
    return forged


def alter_event_field(bundle: Bundle) -> None:
    _events(bundle)[2]["content"]["actor_id"] = "someone-else"


def alter_event_payload(bundle: Bundle) -> None:
    """The payload changed, its hashed digest (v2) or the content (v1) not."""
    event = _events(bundle)[1]
    if event["content"]["v"] == tool.CHAIN_FORMAT_V2:
        event["payload"] = {**(event["payload"] or {}), "forged": True}
    else:
        event["content"]["payload"]["forged"] = True


def drop_payloads(bundle: Bundle) -> None:
    """What retention does to old payloads: null, the digests kept (still intact)."""
    for event in _events(bundle):
        if event["content"]["v"] == tool.CHAIN_FORMAT_V2:
            event["payload"] = None


def claim_a_purge(bundle: Bundle) -> None:
    """The first events cut off and an anchor claimed for them: what a purge
    leaves, which only verify_audit can prove (its tombstone)."""
    events = _events(bundle)
    last_cut = events[1]
    del events[:2]
    bundle["chain"]["anchor"] = {
        "purge_id": str(uuid.uuid4()),
        "seq": last_cut["seq"],
        "event_id": last_cut["content"]["id"],
        "hash": last_cut["hash"],
    }


def cut_the_head_without_an_anchor(bundle: Bundle) -> None:
    del _events(bundle)[:2]


def delete_event(bundle: Bundle) -> None:
    del _events(bundle)[2]


def delete_and_renumber(bundle: Bundle) -> None:
    events = _events(bundle)
    del events[2]
    for i, event in enumerate(events):
        event["seq"] = i + 1


def insert_event(bundle: Bundle) -> None:
    events = _events(bundle)
    events.insert(2, _forged_after(bundle, 1))


def reorder_events(bundle: Bundle) -> None:
    events = _events(bundle)
    events[2], events[3] = events[3], events[2]


def alter_hash(bundle: Bundle) -> None:
    event = _events(bundle)[2]
    event["hash"] = ("0" if event["hash"][0] != "0" else "1") + event["hash"][1:]


def rewrite_chain_consistently(bundle: Bundle) -> None:
    """Alter an event and recompute every hash after it: only the signature knows."""
    events = _events(bundle)
    _set_payload(events[1], {"rewritten": True})
    prev = events[0]["hash"]
    for event in events[1:]:
        event["prev_hash"] = prev
        event["hash"] = tool.event_hash(prev_hash=prev, content=event["content"])
        prev = event["hash"]


def forge_signature(bundle: Bundle) -> None:
    signature = bundle["checkpoint"]["signature"]
    flipped = "f" if signature[10] != "f" else "e"
    bundle["checkpoint"]["signature"] = signature[:10] + flipped + signature[11:]


def alter_signed_field(bundle: Bundle) -> None:
    bundle["checkpoint"]["event_count"] += 1


def _sign(bundle: Bundle, key: Ed25519PrivateKey, key_id: str) -> None:
    checkpoint = bundle["checkpoint"]
    checkpoint["key_id"] = key_id
    message = tool.canonical({name: checkpoint[name] for name in tool.SIGNED_FIELDS})
    checkpoint["signature"] = key.sign(message).hex()


def sign_with_another_key(bundle: Bundle) -> None:
    other = Ed25519PrivateKey.generate()
    _sign(bundle, other, tool.key_id_of(other.public_key()))


def sign_with_another_key_under_the_real_id(bundle: Bundle) -> None:
    _sign(bundle, Ed25519PrivateKey.generate(), bundle["checkpoint"]["key_id"])


def append_unsigned_event(bundle: Bundle) -> None:
    """A forged event after the signed head, correctly linked."""
    _events(bundle).append(_forged_after(bundle, -1))


def drop_checkpoint(bundle: Bundle) -> None:
    bundle["checkpoint"] = None


def truncate_tail(bundle: Bundle) -> None:
    del _events(bundle)[-2:]


def swap_in_another_chain(bundle: Bundle) -> None:
    """The events relabelled as another task's: the hashes no longer match."""
    other = str(uuid.uuid4())
    bundle["chain"]["task_id"] = bundle["task"]["id"] = other
    for event in _events(bundle):
        event["content"]["task_id"] = other


TAMPERS: dict[str, tuple[Callable[[Bundle], None], str]] = {
    "alter an event field": (alter_event_field, tool.ALTERED),
    "alter an event payload": (alter_event_payload, tool.ALTERED),
    "delete an event": (delete_event, tool.DELETED),
    "delete an event and renumber": (delete_and_renumber, tool.DELETED),
    "insert an event": (insert_event, tool.INSERTED),
    "reorder two events": (reorder_events, tool.REORDERED),
    "alter a hash": (alter_hash, tool.ALTERED),
    "rewrite the chain consistently": (rewrite_chain_consistently, tool.ALTERED),
    "forge the signature": (forge_signature, tool.FORGED_CHECKPOINT),
    "alter a signed checkpoint field": (alter_signed_field, tool.FORGED_CHECKPOINT),
    "sign with another key": (sign_with_another_key, tool.FORGED_CHECKPOINT),
    "sign with another key under the real key id": (
        sign_with_another_key_under_the_real_id,
        tool.FORGED_CHECKPOINT,
    ),
    "append an event the checkpoint does not cover": (
        append_unsigned_event,
        tool.NOT_COVERED,
    ),
    "drop the checkpoint": (drop_checkpoint, tool.NOT_COVERED),
    "truncate the tail": (truncate_tail, tool.DELETED),
    "relabel the chain as another task's": (swap_in_another_chain, tool.ALTERED),
    "claim a purge for the first events": (claim_a_purge, tool.UNPROVEN_ANCHOR),
    "cut the first events without an anchor": (
        cut_the_head_without_an_anchor,
        tool.DELETED,
    ),
}


def tampered(bundle: Bundle, name: str) -> Bundle:
    changed = copy.deepcopy(bundle)
    TAMPERS[name][0](changed)
    return changed


def public_pem_of(key: Ed25519PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        .decode()
    )
