"""RFC 8785 (JSON Canonicalization Scheme) bytes: the standard library where it agrees.

Every event hash, payload digest and operation input hash goes through ``dumps``
(audit/chain.py, tasks/hashing.py). The ``rfc8785`` package is pure Python: on the
transition's hot path its per-token writes took about a quarter of the service's own
client CPU (``bench/profile_client.py``). For the values the portal hashes — strings,
integers, booleans, null, lists and objects with ASCII or other BMP keys — the
standard library's C encoder writes the same bytes:

- strings: ``json`` with ``ensure_ascii=False`` escapes exactly RFC 8785's set (``"``,
  ``\\``, the short forms ``\\b \\f \\n \\r \\t`` and ``\\u00xx`` for the other
  controls, lower-case hex; both tables come from the same reference code), and
  leaves every other character as UTF-8;
- integers within ±(2^53 - 1) print as their decimal digits in both;
- object keys: RFC 8785 sorts by UTF-16 code units, ``sort_keys`` by code points;
  the two orders agree unless a key holds a character beyond U+FFFF.

Anything else — a float (ECMAScript's number form differs from ``repr``), an integer
out of range, a non-string or astral-plane key, a lone surrogate, an unknown type —
goes to ``rfc8785`` itself, which writes or refuses it as before.
``tests/unit/portal/test_jcs.py`` compares the two byte for byte on generated values.
"""

from __future__ import annotations

import json
from typing import Any, Final

import rfc8785

_SAFE_INTEGER: Final = 2**53 - 1
_BMP_END: Final = "\uffff"
_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)


def dumps(value: Any) -> bytes:
    """The RFC 8785 canonical JSON of ``value``, as ``rfc8785.dumps`` writes it.

    Raises:
        rfc8785.CanonicalizationError: what rfc8785 refuses (NaN, infinities,
            integers beyond ±(2^53 - 1), non-string keys, lone surrogates,
            non-JSON types).
    """
    if _agrees(value):
        try:
            return _ENCODER.encode(value).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: rfc8785 refuses it with its own error
    return bytes(rfc8785.dumps(value))


def stdlib_agrees(value: Any) -> bool:
    """Whether ``dumps`` writes ``value`` with the standard library's encoder (the
    values listed above), not with ``rfc8785``."""
    return _agrees(value)


def _agrees(value: Any) -> bool:
    """Whether the standard library writes ``value`` as RFC 8785 does."""
    if value is None or isinstance(value, (str, bool)):
        return True
    if isinstance(value, int):
        return -_SAFE_INTEGER <= value <= _SAFE_INTEGER
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not (key.isascii() or max(key) <= _BMP_END):
                return False
            if not _agrees(item):
                return False
        return True
    if isinstance(value, (list, tuple)):
        return all(_agrees(item) for item in value)
    return False
