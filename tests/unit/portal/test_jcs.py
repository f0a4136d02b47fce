"""``portal.jcs.dumps`` writes exactly what ``rfc8785.dumps`` writes, or refuses alike.

The fast path is the standard library's encoder; these tests try to make the two
disagree: every Unicode code point in strings and in keys, key orders where UTF-16
and code points differ, escapes, integers at the edges of the safe range, floats,
tuples, enum members, and generated nested values.
"""

from __future__ import annotations

import enum
import os
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from portal import jcs
from tests.unit.audit.test_verify_bundle_canonical import (
    TRICKY_FLOATS,
    TRICKY_KEYS,
    TRICKY_TEXT,
)


def _same(value: Any) -> None:
    try:
        expected = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as error:
        # rfc8785 refuses a surrogate in a key with UnicodeEncodeError
        with pytest.raises(type(error)):
            jcs.dumps(value)
        return
    assert jcs.dumps(value) == expected, repr(value)


def test_every_code_point_in_a_string_and_in_a_key() -> None:
    # 0x110000 characters, surrogates included, in chunks of 512 per string
    for start in range(0, 0x110000, 512):
        text = "".join(chr(c) for c in range(start, min(start + 512, 0x110000)))
        _same(text)
        _same({text: 1, "a": text})
    for code in (*range(0x80), 0xD7FF, 0xD800, 0xDFFF, 0xE000, 0xFFFF, 0x10000):
        _same({chr(code): code, "k" + chr(code): [chr(code)]})


def test_keys_where_utf16_order_and_code_point_order_differ() -> None:
    # U+E000..U+FFFF sort after an astral character's surrogates in UTF-16
    value = {"\ufb01": 1, "\U0001f600": 2, "\ue000": 3, "z": 4, "": 5}
    assert jcs.dumps(value) == rfc8785.dumps(value)
    assert list(rfc8785.dumps(value).decode()).index("\U0001f600") < list(
        rfc8785.dumps(value).decode()
    ).index("\ue000")
    _same({key: key for key in TRICKY_KEYS})


def test_tricky_text_integers_floats_and_types() -> None:
    for text in TRICKY_TEXT:
        _same(text)
        _same({"t": text, text: [text]})
    for integer in (0, 1, -1, 2**53 - 1, -(2**53 - 1), 2**53, -(2**53), 10**30):
        _same(integer)
        _same({"n": [integer]})
    for number in TRICKY_FLOATS:
        _same({"f": number, "l": [number, 1]})
    values: list[Any] = [True, False, None, (), [], {}, ("a", 1), [[], {}], {"a": ()}]
    for value in values:
        _same(value)
    for refused in (float("nan"), float("inf"), {1: "x"}, {"a": object()}, b"x"):
        _same(refused)


class _Code(enum.StrEnum):
    DONE = "task.done"


class _Level(enum.IntEnum):
    HIGH = 3


def test_enum_members_write_as_their_values() -> None:
    _same({"code": _Code.DONE, "level": _Level.HIGH, _Code.DONE: True})


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**54), max_value=2**54)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


# 500 generated values in CI (a few seconds); PORTAL_JCS_EXAMPLES=3000 or more by hand.
# The enumerations above already cover every code point, key order and edge number.
EXAMPLES = int(os.environ.get("PORTAL_JCS_EXAMPLES", "500"))


@settings(max_examples=EXAMPLES, deadline=None)
@given(_json)
def test_generated_values(value: Any) -> None:
    _same(value)
