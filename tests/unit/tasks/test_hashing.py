"""The input hash is SHA-256 over RFC 8785 canonical JSON (docs/input-hash.md)."""

from __future__ import annotations

import hashlib

from tasks.hashing import canonical_json, input_hash


def test_canonical_form_sorts_keys_and_normalises_numbers():
    assert canonical_json({"b": 1.0, "a": [True, None, "é"]}) == (
        '{"a":[true,null,"é"],"b":1}'.encode()
    )


def test_the_documented_example():
    """The worked example in docs/input-hash.md, computed independently here."""
    value = {"summary": "Refund order 1042", "queue": "billing", "priority": 2}
    expected = hashlib.sha256(
        b'{"priority":2,"queue":"billing","summary":"Refund order 1042"}'
    ).hexdigest()
    assert input_hash(value) == expected
