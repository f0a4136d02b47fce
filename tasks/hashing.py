"""The operation input hash: SHA-256 over RFC 8785 (JCS) canonical JSON.

Any client, in any language, computes the same hash: serialise the input with a JCS
implementation, hash the UTF-8 bytes, write the digest as 64 lower-case hex digits.
docs/input-hash.md has the rules and a worked example.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

from portal import jcs

from .exceptions import InputNotCanonicalisable


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical form of ``value``.

    Raises:
        InputNotCanonicalisable: NaN or infinite floats, integers beyond the IEEE 754
            safe range (±2^53-1), non-string keys or non-JSON types.
    """
    try:
        return jcs.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as error:
        raise InputNotCanonicalisable(reason=str(error)) from None


def input_hash(value: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
