"""The offline verifier's RFC 8785 agrees byte for byte with the portal's hashing.

``tools/verify_bundle.py`` may use the standard library and ``cryptography`` only, so
it carries its own canonical JSON. Here it is compared with ``audit/chain.py`` (the
``rfc8785`` package) on thousands of values: event contents with unicode, floats of
every magnitude, nesting and the integers the chain hashes as strings, each also
after the JSON round trip a bundle makes. The tool's imports are checked too.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import math
import random
import struct
import subprocess
import sys
import uuid
from typing import Any

import pytest
import rfc8785

from audit import chain
from tests.support.evidence import TOOL, load_tool

tool = load_tool()

# Strings that canonicalise differently under a careless implementation: escapes,
# controls, DEL, line separators, astral characters (surrogate pairs in UTF-16).
TRICKY_TEXT = [
    "",
    "plain",
    'quote " and backslash \\ and slash /',
    "\b\f\n\r\t",
    "\x00\x01\x1f",
    "\x7f",
    "\u2028\u2029",
    "ünïcode ✓ 日本語",
    "emoji 😀 and 𝄞",
    "e\u0301 (combining)",
    "\ufeffbom",
    "\ue000 private use",
    "</script>",
]
TRICKY_KEYS = ["a", "B", "é", "\ue000", "😀", "\U0001f600x", "", "10", "2", "_", "ä"]
TRICKY_FLOATS = [
    0.1, 0.5, 1.0, -1.0, 1.5, 100.0, 123.456, 1e-7, 1.5e-7, 1e-6, 9.999e-7, 1e-5,
    0.000001, 1e16, 1e20, 1e21, 1.5e20, 1.2345e21, 1e22, 1e300, 1.7976931348623157e308,
    5e-324, 2.2250738585072014e-308, 9007199254740993.0, 4.35, 0.30000000000000004,
    -0.0, 333333333.3333333, 1e-4, 1.0e15, 12345678901234567890.0,
]  # fmt: skip


def random_float(rng: random.Random) -> float:
    """Any finite double, from a random bit pattern."""
    while True:
        (value,) = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))
        if math.isfinite(value):
            return value


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-(2**53) + 1, 2**53 - 1)
    if kind == 2:
        return rng.choice([random_float(rng), rng.choice(TRICKY_FLOATS)])
    if kind == 3:
        return rng.choice(TRICKY_TEXT) + "".join(
            chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0xD7FF)]))
            for _ in range(rng.randint(0, 6))
        )
    if kind == 4:
        return rng.uniform(-1e6, 1e6)
    if kind == 5:
        return 2 ** rng.randint(53, 80) * rng.choice([1, -1])  # hashed as a string
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = rng.sample(TRICKY_KEYS, rng.randint(0, 5))
    return {key: random_value(rng, depth + 1) for key in keys}


def event(rng: random.Random) -> dict[str, Any]:
    return chain.event_content(
        event_id=uuid.UUID(int=rng.getrandbits(128)),
        tenant_id=uuid.UUID(int=rng.getrandbits(128)),
        task_id=uuid.UUID(int=rng.getrandbits(128)),
        operation_id=rng.choice([None, uuid.UUID(int=rng.getrandbits(128))]),
        code="task.transitioned",
        actor_type="agent",
        actor_id=rng.choice(TRICKY_TEXT),
        reason_code=rng.choice([None, "FIELD_STALE"]),
        contract_key=rng.choice([None, "customer-issue"]),
        contract_version=rng.choice([None, 1, 7]),
        payload={key: random_value(rng) for key in rng.sample(TRICKY_KEYS, 6)},
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        created_at="2026-12-01T16:30:00.123456Z",
    )


def test_every_tricky_float_matches() -> None:
    for value in TRICKY_FLOATS:
        assert tool.canonical(value) == rfc8785.dumps(value), value
        assert tool.canonical(-value) == rfc8785.dumps(-value), -value


def test_random_doubles_of_every_magnitude_match() -> None:
    """Every exponent range: ECMAScript's number form, as rfc8785 writes it."""
    rng = random.Random(8785)
    for _ in range(200_000):
        value = random_float(rng)
        assert tool.canonical(value) == rfc8785.dumps(value), repr(value)
    for exponent in range(-330, 310):
        for mantissa in (1.0, 1.5, 9.999999999999999, 4.35, 7.0):
            value = float(f"{mantissa}e{exponent}")  # 0.0 and inf at the ends
            if math.isfinite(value):
                assert tool.canonical(value) == rfc8785.dumps(value), repr(value)


def test_object_members_sort_by_utf16_code_units() -> None:
    # given keys whose UTF-16 order differs from their code point order
    value = {"\ue000": 1, "😀": 2, "a": 3, "é": 4}
    # then both put the astral character (a surrogate pair, 0xD83D...) before U+E000
    assert tool.canonical(value) == rfc8785.dumps(value)
    assert tool.canonical(value).decode().index("😀") < tool.canonical(
        value
    ).decode().index("\ue000")


def test_random_event_contents_hash_alike_before_and_after_a_json_round_trip() -> None:
    rng = random.Random(20261201)
    for _ in range(3000):
        content = event(rng)
        expected = chain.canonical(content)
        assert tool.canonical(content) == expected
        # what the verifier really sees: the bundle's JSON text, parsed again
        parsed = json.loads(json.dumps(content, ensure_ascii=False, indent=2))
        assert tool.canonical(parsed) == expected
        prev = rng.choice([None, f"{rng.getrandbits(256):064x}"])
        assert tool.event_hash(prev_hash=prev, content=parsed) == chain.event_hash(
            prev_hash=prev, content=content
        )


def test_random_payload_digests_match_after_a_json_round_trip() -> None:
    """Chain format v2 hashes the payload's digest: the tool recomputes it from the
    payload as the bundle carries it (large integers as they are, hashed as
    strings by the same rule)."""
    rng = random.Random(20261202)
    for _ in range(2000):
        payload = {key: random_value(rng) for key in rng.sample(TRICKY_KEYS, 5)}
        expected = chain.payload_digest(payload)
        parsed = json.loads(json.dumps(payload, ensure_ascii=False))
        assert tool.payload_digest(parsed) == expected
        content = chain.event_content(
            **{**V2_FIELDS, "payload": payload, "payload_digest": expected}
        )
        assert "payload" not in content and content["v"] == 2
        round_trip = json.loads(json.dumps(content))
        assert tool.event_hash(prev_hash=None, content=round_trip) == chain.event_hash(
            prev_hash=None, content=content
        )


V2_FIELDS: dict[str, Any] = {
    "event_id": uuid.UUID(int=7),
    "tenant_id": uuid.UUID(int=8),
    "task_id": uuid.UUID(int=9),
    "operation_id": None,
    "code": "task.transitioned",
    "actor_type": "system",
    "actor_id": "t",
    "reason_code": None,
    "contract_key": None,
    "contract_version": None,
    "trace_id": "",
    "span_id": "",
    "created_at": "2026-12-01T16:30:00.123456Z",
}


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, 2**53, -(2**53), "\ud800", {"\udfff": 1}, {1: 2}],
    ids=["nan", "inf", "-inf", "2^53", "-2^53", "lone-surrogate", "surrogate-key", "int-key"],
)  # fmt: skip
def test_both_refuse_what_rfc8785_cannot_represent(value: Any) -> None:
    with pytest.raises((rfc8785.CanonicalizationError, UnicodeEncodeError)):
        rfc8785.dumps(value)
    with pytest.raises(tool.CanonicalizationError):
        tool.canonical(value)


def test_the_tool_imports_only_the_standard_library_and_cryptography() -> None:
    tree = ast.parse(TOOL.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports in a standalone script"
            roots.add((node.module or "").split(".")[0])
    # rfc3161-client only for --tsa-root, imported inside the functions that use it
    # (docs/audit-integrity.md, "Timestamps"): never at the module's top level.
    assert roots - set(sys.stdlib_module_names) == {"cryptography", "rfc3161_client"}
    top = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
    }
    assert "rfc3161_client" not in top


def test_the_tool_runs_without_django_or_the_repository() -> None:
    """Run from another directory, isolated from the repository's packages."""
    script = (
        "import runpy, sys; sys.argv = ['verify_bundle', '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(TOOL)!r}, run_name='__main__')\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in "
        "('django', 'audit', 'tasks', 'portal', 'rfc8785')]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Verify a task's evidence bundle offline" in done.stdout


def test_the_tool_names_breaks_and_signs_as_the_portal_does() -> None:
    """The kinds match verify_audit's; the signed fields and formats match the
    portal's (the tool cannot import them: it stands alone)."""
    from audit import checkpoints, verify

    for kind in ("ALTERED", "DELETED", "INSERTED", "REORDERED", "FORGED_CHECKPOINT"):
        assert getattr(tool, kind) == getattr(verify, kind)
    assert tool.GENESIS == chain.GENESIS
    assert {chain.FORMAT_V1, chain.FORMAT_VERSION} == tool.CHAIN_FORMAT_VERSIONS
    assert tool.CHAIN_FORMAT_V2 == chain.FORMAT_VERSION
    assert {checkpoints.SIGNATURE_FORMAT_VERSION} == tool.SIGNATURE_FORMAT_VERSIONS
    message = checkpoints.signed_message(
        tenant_id=uuid.UUID(int=1),
        task_id=uuid.UUID(int=2),
        head_seq=3,
        head_event_id=uuid.UUID(int=4),
        head_hash="a" * 64,
        event_count=5,
        signed_at=dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
        key_id="0123456789abcdef",
    )
    assert list(json.loads(message)) == sorted(tool.SIGNED_FIELDS)
