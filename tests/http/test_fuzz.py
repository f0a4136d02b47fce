"""Hypothesis drives the classes of issue 10 §3 at a real gunicorn: no 5xx, ever.

Each example is one raw request: a method (known, TRACE, CONNECT, made up, or not a
token at all), a route of the URL conf with real, unknown or mangled ids, a query
string of odd bytes and broken percent-encodings, extra headers (odd values, up to
12 KB, up to 120 of them), and a body (JSON up to well past the depth limit,
invalid UTF-8, NUL bytes, sizes over the limit) under one of several content
types. Bounded and deterministic: a fixed number of examples, derandomized, no
example database.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any
from urllib.parse import quote_from_bytes

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Server, World, api_routes, fill
from .raw import exchange, request_bytes
from .test_no_5xx import LIMIT, METHODS, assert_handled

EXAMPLES = 300

ODD_BYTES = st.binary(min_size=1, max_size=12)
ENCODED = st.one_of(  # what HTTP allows in a target: %XX of any bytes, or broken %
    ODD_BYTES.map(lambda b: quote_from_bytes(b).encode()),
    st.sampled_from([b"%", b"%z", b"%zz", b"%00", b"%c0%af", b"%ed%a0%80", b"%%"]),
)
ODD_TEXT = st.one_of(ENCODED, ODD_BYTES)  # ... or raw bytes, as sent

KNOWN_METHODS = st.sampled_from(METHODS).map(str.encode)
TOKENS = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ-_", min_size=1, max_size=12).map(
    str.encode
)
methods = st.one_of(
    KNOWN_METHODS,
    TOKENS,
    st.sampled_from([b"get", b"G\x00T", b"GET\x7f", b"", b"\xff", b"GET /"]),
)


def sometimes(odd: st.SearchStrategy[Any], usual: st.SearchStrategy[Any]) -> Any:
    """``usual`` two times in three: the odd case must not hide the application."""
    return st.one_of(usual, usual, odd)


@st.composite
def targets(draw: st.DrawFn, world: World, *, encoded: bool) -> bytes:
    """A route of the URL conf; odd segments and query pairs, %-encoded or raw."""
    odd = ENCODED if encoded else ODD_TEXT
    route = draw(st.sampled_from(api_routes()))
    path = fill(route, world, real_ids=draw(st.booleans())).encode()
    segments = path.split(b"/")  # b"", b"api", b"v1", ...: keep it under /api/
    if len(segments) > 3 and draw(st.integers(0, 4)) == 0:  # mangle one segment
        index = draw(st.integers(3, len(segments) - 1))
        segments[index] = draw(odd)
        path = b"/".join(segments)
    word = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", max_size=12).map(str.encode)
    pairs = draw(
        st.lists(st.tuples(sometimes(odd, word), sometimes(odd, word)), max_size=3)
    )
    if pairs:
        path += b"?" + b"&".join(key + b"=" + value for key, value in pairs)
    return path


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=10), children, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(["json", "json", "json", "deep", "bytes", "big", "none"])
    )
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "deep":
        depth = draw(st.sampled_from([60, 64, 65, 200, 999, 1_001, 50_000]))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        return opener * depth + b"1" + closer * depth
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "big":
        return (
            b'{"a": "'
            + b"x" * draw(st.sampled_from([LIMIT - 20, LIMIT + 1, 4_000_000]))
            + b'"}'
        )
    return b""


content_types = st.sampled_from(
    [
        b"application/json",
        b"application/json; charset=utf-8",
        b"application/json; charset=latin-1",
        b"application/json; charset=bz2_codec",
        b"application/json; charset=nonsense",
        b"application/problem+json",
        b"text/plain",
        b"application/x-www-form-urlencoded",
        b"multipart/form-data; boundary=b",
        b"\xff\xfe",
        b"",
    ]
)


@st.composite
def extra_headers(
    draw: st.DrawFn, world: World, *, wire_safe: bool
) -> dict[str, bytes]:
    """Known headers with odd values; with ``wire_safe`` none gunicorn must refuse."""
    headers: dict[str, bytes] = {}
    auth = draw(st.sampled_from(["key", "key", "key", "none", "garbage"]))
    if auth == "key":
        headers["Authorization"] = world.auth.encode()
    elif auth == "garbage":
        headers["Authorization"] = b"Bearer " + draw(ENCODED if wire_safe else ODD_TEXT)
    printable = st.text(
        st.characters(
            min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"
        ),
        max_size=40,
    ).map(lambda t: t.encode("latin-1"))
    header_values = (
        st.one_of(printable, ENCODED, st.sampled_from([b"x" * 4_000, b"0" * 30]))
        if wire_safe
        else st.one_of(
            ODD_TEXT, printable, st.sampled_from([b"x" * 9_000, b"y" * 12_000])
        )
    )
    for name in draw(
        st.lists(
            st.sampled_from(
                [
                    "Idempotency-Key",
                    "Lease-Token",
                    "traceparent",
                    "Accept",
                    "Accept-Encoding",
                    "Cookie",
                    "X-Forwarded-For",
                    "Expect",
                    "Range",
                    "If-None-Match",
                    "X-CSRFToken",
                    "Origin",
                ]
            ),
            max_size=4,
            unique=True,
        )
    ):
        headers[name] = draw(header_values)
    for index in range(draw(st.sampled_from([0, 10, 90] if wire_safe else [0, 120]))):
        headers[f"X-Filler-{index}"] = b"1"
    return headers


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same examples every run
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _send(
    server: Server,
    method: bytes,
    target: bytes,
    headers: dict[str, Any],
    content_type: bytes,
    body: bytes,
) -> int:
    if content_type:
        headers = {**headers, "Content-Type": content_type}
    answer = exchange(
        server.port,
        request_bytes(method, target, headers=headers, body=body),
        head_request=method == b"HEAD",
    )
    assert_handled(answer, (method, target[:200], content_type, body[:80]))
    return answer.status


def test_fuzz_well_formed_http_with_odd_content(
    debug_server: Server, world: World
) -> None:
    """Requests HTTP can carry: every method and route, odd values, bodies, types."""
    statuses: Counter[int] = Counter()

    @FUZZ_SETTINGS
    @given(
        method=st.one_of(KNOWN_METHODS, KNOWN_METHODS, TOKENS),
        target=targets(world, encoded=True),
        headers=extra_headers(world, wire_safe=True),
        content_type=content_types,
        body=bodies(),
        plain=st.sampled_from([None, None, b"GET", b"OPTIONS"]),
    )
    def one_request(
        method: bytes,
        target: bytes,
        headers: dict[str, Any],
        content_type: bytes,
        body: bytes,
        plain: bytes | None,
    ) -> None:
        if plain is not None:
            # A read with the key and nothing odd but the body: these must reach
            # the views and succeed, or the odd requests prove little.
            method, headers = plain, {"Authorization": world.auth.encode()}
            target = target.partition(b"?")[0]
        statuses[_send(debug_server, method, target, headers, content_type, body)] += 1

    one_request()
    print(
        f"well-formed: {EXAMPLES} examples, statuses {dict(sorted(statuses.items()))}"
    )
    # The examples reached the application and its refusals, not only the server's.
    assert {200, 400, 401, 404, 405} <= set(statuses), statuses


def test_fuzz_malformed_http(debug_server: Server, world: World) -> None:
    """Requests gunicorn itself refuses or barely accepts: raw bytes, sizes, counts."""
    statuses: Counter[int] = Counter()

    @FUZZ_SETTINGS
    @given(
        method=methods,
        target=targets(world, encoded=False),
        headers=extra_headers(world, wire_safe=False),
        content_type=content_types,
        body=bodies(),
    )
    def one_request(
        method: bytes,
        target: bytes,
        headers: dict[str, Any],
        content_type: bytes,
        body: bytes,
    ) -> None:
        statuses[_send(debug_server, method, target, headers, content_type, body)] += 1

    one_request()
    print(f"malformed: {EXAMPLES} examples, statuses {dict(sorted(statuses.items()))}")
    assert {400, 431} <= set(statuses), statuses
