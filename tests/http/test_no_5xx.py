"""No 5xx, whatever arrives (issue 10 §3), against a real gunicorn on 127.0.0.1.

Every answer under /api/ that is an error is problem+json with a ``code``, from
Django, DRF or gunicorn itself; and after it the connection is either still usable
or was closed cleanly after ``Connection: close``.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from portal.parsers import MAX_DEPTH

from .conftest import Server, World, api_routes, fill
from .raw import PROBE, Answer, Connection, exchange, request_bytes

METHODS = (
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT",
    "FOO",
)  # fmt: skip
LIMIT = 2_621_440  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE, the portal's body limit


def assert_handled(answer: Answer, what: object) -> None:
    """No 5xx; an error is problem+json with a code; the connection state is right."""
    assert answer.status < 500, (what, answer.status, answer.body[:500])
    if answer.status >= 400:
        assert answer.content_type == "application/problem+json", (what, answer)
        if answer.body:  # HEAD answers carry none
            problem = answer.json()
            assert problem["status"] == answer.status, (what, problem)
            assert problem["code"].isupper(), (what, problem)
    assert answer.after in ("open", "closed"), (what, answer.after)


def send(server: Server, world: World, method: str, target: str, **kwargs: object):
    headers = {"Authorization": world.auth, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    data = request_bytes(method, target, headers=headers, **kwargs)  # type: ignore[arg-type]
    return exchange(server.port, data, head_request=method == "HEAD")


def test_every_method_on_every_api_route(server: Server, world: World) -> None:
    routes = api_routes()
    assert len(routes) > 20  # the URL conf, not a hand-written list
    for route in routes:
        for real_ids in (True, False):
            path = fill(route, world, real_ids=real_ids)
            for method in METHODS:
                answer = send(
                    server,
                    world,
                    method,
                    path,
                    headers={"Content-Type": "application/json"},
                    body=b"{}",
                )
                assert_handled(answer, (method, path))
                assert "TRACE" not in answer.headers.get("allow", ""), (method, path)
                if method in ("TRACE", "CONNECT", "FOO"):
                    assert answer.status in (401, 403, 405), (method, path, answer)


def test_trace_is_405_with_an_allow_that_omits_it(server: Server, world: World) -> None:
    answer = send(server, world, "TRACE", "/api/v1/tasks")
    assert_handled(answer, "TRACE")
    assert answer.status == 405
    assert answer.json()["code"] == "METHOD_NOT_ALLOWED"
    assert answer.headers["allow"] == "GET, POST, HEAD, OPTIONS"


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 100_000])
def test_deep_json_is_a_400(server: Server, world: World, depth: int) -> None:
    answer = send(
        server,
        world,
        "POST",
        "/api/v1/tasks",
        headers={"Content-Type": "application/json"},
        body=b'{"input": ' + _nested(depth - 1) + b"}",
    )
    assert_handled(answer, depth)
    assert answer.status == 400
    assert answer.json()["code"] == "MALFORMED_REQUEST"
    assert answer.json()["max_depth"] == MAX_DEPTH


def test_json_at_the_depth_limit_reaches_validation(
    server: Server, world: World
) -> None:
    answer = send(
        server,
        world,
        "POST",
        "/api/v1/tasks",
        headers={"Content-Type": "application/json"},
        body=b'{"input": ' + _nested(MAX_DEPTH - 1) + b"}",
    )
    assert_handled(answer, MAX_DEPTH)
    assert answer.json()["code"] == "VALIDATION_FAILED"  # the parser let it through


@pytest.mark.parametrize(
    "body",
    [b'{"input": 1e999}', b'{"input": NaN}', b'{"input": -Infinity}'],
    ids=["overflow", "nan", "infinity"],
)
def test_numbers_json_cannot_hold_are_a_400(
    server: Server, world: World, body: bytes
) -> None:
    answer = send(
        server,
        world,
        "POST",
        "/api/v1/tasks",
        headers={"Content-Type": "application/json"},
        body=body,
    )
    assert_handled(answer, body)
    assert answer.status == 400
    assert answer.json()["code"] == "MALFORMED_REQUEST"


@pytest.mark.parametrize(
    "target",
    [
        "/api/v1/object-versions/a%00b/c",
        "/api/v1/object-versions/a/%00",
        "/api/v1/contracts/a%00b/versions/1",
        "/api/v1/tasks?state=%00",
        "/api/v1/tasks/%00",
        "/api/v1/tasks?%00=1",
    ],
)
def test_nul_in_path_or_query_is_refused_before_the_database(
    server: Server, world: World, target: str
) -> None:
    for method in ("GET", "PUT"):
        answer = send(server, world, method, target)
        assert_handled(answer, (method, target))
        assert answer.status == 400
        assert answer.json()["code"] == "MALFORMED_REQUEST"


@pytest.mark.parametrize(
    "target",
    [
        b"/api/v1/tasks/%zz",
        b"/api/v1/tasks/%ff%fe",
        b"/api/v1/object-versions/%c0%af/%ed%a0%80",
        b"/api/v1/object-versions/\xff\xfe/x",
        b"/api/v1/tasks?limit=%ff&order=%",
        b"/api/v1/tasks?" + b"&".join(b"a=%d" % i for i in range(1_200)),
        b"/api/v1/tasks?limit=99999999999999999999999999",
        b"/api/v1/../v1/tasks",
        b"/api//v1/tasks",
        b"/api/v1/tasks/" + b"x" * 5_000,
        b"/api/v1/tasks\x7f",
    ],
)
def test_odd_bytes_and_encodings_in_the_target(
    server: Server, world: World, target: bytes
) -> None:
    answer = exchange(
        server.port,
        request_bytes("GET", target, headers={"Authorization": world.auth}),
    )
    assert_handled(answer, target)


@pytest.mark.parametrize(
    "path",
    ["/api", "/api/", "/api/v1/nope", "/api/v2/tasks", "/api/v1/tasks/not-a-uuid"],
)
def test_unknown_api_paths_and_non_uuid_ids_are_404_problems(
    server: Server, world: World, path: str
) -> None:
    answer = send(server, world, "GET", path)
    assert_handled(answer, path)
    assert answer.status == 404
    assert answer.json()["code"] == "NOT_FOUND"


@pytest.mark.parametrize("path", ["/api/v1", "/api/schema", "/api/docs"])
def test_a_write_to_a_path_missing_its_slash_is_a_404(
    server: Server, world: World, path: str
) -> None:
    """APPEND_SLASH raised RuntimeError on these with DEBUG on (a 500)."""
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        answer = send(
            server,
            world,
            method,
            path,
            headers={"Content-Type": "application/json"},
            body=b"{}",
        )
        assert_handled(answer, (method, path))
        assert answer.status == 404
        assert answer.json()["code"] == "NOT_FOUND"
    assert send(server, world, "GET", path).status == 301  # reads still redirect


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b'{"client_task_id": "\xff\xfe"}'),
        ("application/json", b"\xef\xbb\xbf{}"),  # a BOM
        ("application/json; charset=utf-16", b'{"a": 1}'),
        ("application/json; charset=bz2_codec", b"BZh91AY&SY"),
        ("application/json; charset=nonsense", b"{}"),
        ("text/plain", b"hello"),
        ("application/x-www-form-urlencoded", b"a=1&b=%00"),
        ("multipart/form-data; boundary=x", b"--x\r\nbroken"),
        ("multipart/form-data", b"no boundary"),
        ("", b"{}"),
        ("application/json", b""),
        ("application/json", b"\x00" * 64),
        ("application/json", b'{"a": "\\ud800"}'),
        ("application/json", b'{"a": 1' + b"0" * 5_000 + b"}"),
    ],
)
def test_bodies_and_content_types(
    server: Server, world: World, content_type: str, body: bytes
) -> None:
    for path in ("/api/v1/tasks", fill("/api/v1/tasks/<uuid:t>/lease", world)):
        headers = {"Content-Type": content_type} if content_type else {}
        answer = send(server, world, "POST", path, headers=headers, body=body)
        assert_handled(answer, (path, content_type, body[:40]))
        assert answer.status in (400, 404, 415), answer


def test_a_charset_that_is_no_text_encoding_is_a_415(
    server: Server, world: World
) -> None:
    """Django's request failed on it while reading the query string: a 500."""
    for target in ("/api/v1/tasks?state=pending", "/api/v1/?a=b", "/admin/?a=b"):
        answer = send(
            server,
            world,
            "GET",
            target,
            headers={"Content-Type": "application/json; charset=bz2_codec"},
        )
        assert_handled(answer, target)
        assert answer.status == 415
        assert answer.json()["code"] == "UNSUPPORTED_MEDIA_TYPE"


def test_a_chunked_body_is_handled(server: Server, world: World) -> None:
    chunked = b'5\r\n{"a":\r\n2\r\n1}\r\n0\r\n\r\n'
    answer = send(
        server,
        world,
        "POST",
        "/api/v1/tasks",
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        body=chunked,
    )
    assert_handled(answer, "chunked")


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"X-Big": "a" * 10_000}, 431, "HEADERS_TOO_LARGE"),
        ({"Authorization": "Bearer " + "a" * 10_000}, 431, "HEADERS_TOO_LARGE"),
        ({f"X-Many-{i}": "1" for i in range(150)}, 431, "HEADERS_TOO_LARGE"),
        ({"X-Bad\x01Name": "1"}, 400, "MALFORMED_REQUEST"),
        ({"X-Nul": "a\x00b"}, 400, "MALFORMED_REQUEST"),
        ({"Transfer-Encoding": "foo"}, 400, "MALFORMED_REQUEST"),
    ],
    ids=["big-header", "big-authorization", "many-headers", "bad-name", "nul", "te"],
)
def test_headers_gunicorn_refuses_are_problems_too(
    server: Server, world: World, headers: dict[str, str], status: int, code: str
) -> None:
    answer = exchange(
        server.port, request_bytes("GET", "/api/v1/tasks", headers=headers)
    )
    # Refused before Django runs; gunicorn's status, a problem document, and the
    # connection closed after ``Connection: close``.
    assert_handled(answer, headers)
    assert (answer.status, answer.json()["code"]) == (status, code)
    assert answer.headers["connection"] == "close"
    assert answer.after == "closed"


def test_odd_header_values_reach_the_app_and_are_handled(
    server: Server, world: World
) -> None:
    cases: list[tuple[str, bytes]] = [
        ("Authorization", b"Bearer \xff\xfe"),
        ("Authorization", b"Basic abc"),
        ("Authorization", b"Bearer"),
        ("Idempotency-Key", b"\xff" * 10),
        ("Idempotency-Key", b"k" * 5_000),
        ("Lease-Token", b"99999999999999999999999"),
        ("traceparent", b"00-" + b"f" * 200),
        ("Accept", b"text/html"),
        ("Accept", b"application/xml;q=1, */*;q=0"),
        ("Host", b"evil.example"),
        ("Host", b"\xff"),
        ("Cookie", b"sessionid=\xff; csrftoken=%00"),
        ("Content-Length", b"-1"),
        ("Content-Length", b"abc"),
        ("Expect", b"100-continue"),
        ("Expect", b"nothing-you-know"),
    ]
    for name, value in cases:
        for method in ("GET", "POST"):
            headers: dict[str, str | bytes] = {"Content-Type": "application/json"}
            if name != "Authorization":
                headers["Authorization"] = world.auth
            headers[name] = value
            data = request_bytes(method, "/api/v1/tasks", headers=headers, body=b"{}")
            answer = exchange(server.port, data)
            assert_handled(answer, (method, name, value[:40]))


@pytest.mark.parametrize("size", [LIMIT + 1, 3_000_000, 20_000_000])
def test_an_oversized_body_is_a_413_and_the_connection_ends_cleanly(
    server: Server, world: World, size: int
) -> None:
    body = b'{"input": "' + b"x" * (size - 13) + b'"}'
    assert len(body) == size
    for extra in ({}, {"Idempotency-Key": "big-1"}):
        answer = send(
            server,
            world,
            "POST",
            "/api/v1/tasks",
            headers={"Content-Type": "application/json", **extra},
            body=body,
        )
        assert_handled(answer, (size, extra))
        assert answer.status == 413
        assert answer.json()["code"] == "REQUEST_TOO_LARGE"
        assert answer.headers["connection"] == "close"


def test_a_keep_alive_client_goes_on_after_a_413(server: Server, world: World) -> None:
    """httpx keeps connections: after the 413 (Connection: close) it reconnects."""
    with httpx.Client(
        base_url=server.base_url, headers={"Authorization": world.auth}, timeout=30
    ) as client:
        big = json.dumps({"input": "x" * 3_000_000})
        first = client.post(
            "/api/v1/tasks", content=big, headers={"Content-Type": "application/json"}
        )
        assert first.status_code == 413
        assert first.headers["content-type"] == "application/problem+json"
        second = client.get("/api/v1/tasks")
        assert second.status_code == 200


@pytest.mark.parametrize("size", [LIMIT + 1, 20_000_000])
@pytest.mark.parametrize("authorized", [True, False], ids=["413", "401"])
def test_a_client_still_sending_its_body_gets_the_answer_and_a_clean_close(
    server: Server, world: World, size: int, authorized: bool
) -> None:
    """An answer given before the body was read (413 too large, 401 no key) must not
    reset the connection under a client still writing: the worker reads the rest of
    the body away, answers, and closes with a FIN. Before, the client's write met a
    broken pipe and the answer could be lost."""
    # Given a keep-alive client that writes a whole oversized body, then its next
    # request on the same connection, without waiting (nothing suppresses errors)
    body = b'{"input": "' + b"x" * (size - 13) + b'"}'
    headers = {"Content-Type": "application/json"}
    if authorized:
        headers["Authorization"] = world.auth
    first = request_bytes("POST", "/api/v1/tasks", headers=headers, body=body)
    second = request_bytes(
        "GET", "/api/v1/tasks", headers={"Authorization": world.auth}
    )
    write_errors: list[BaseException] = []
    with Connection(server.port) as conn:

        def write() -> None:
            try:
                conn.sock.sendall(first)
                conn.sock.sendall(second)
            except OSError as error:
                write_errors.append(error)

        writer = threading.Thread(target=write)
        writer.start()
        # When it reads the answer while writing
        answer = conn.read_answer()
        answer.after = conn.state_after(answer, port_probe=b"")
        writer.join(timeout=60)

    # Then every byte went out, the answer is the problem document, and the server
    # ended the connection cleanly after saying Connection: close
    assert not writer.is_alive()
    assert write_errors == [], write_errors
    assert_handled(answer, size)
    expected = (413, "REQUEST_TOO_LARGE") if authorized else (401, "UNAUTHENTICATED")
    assert (answer.status, answer.json()["code"]) == expected
    assert answer.headers["connection"] == "close"
    assert answer.after == "closed"


def test_a_host_outside_allowed_hosts_is_a_problem(server: Server) -> None:
    """Django's HTML 400 for a Host not in ALLOWED_HOSTS was written outside the
    middleware that rewrites errors (the tracing middleware reads the host first);
    the WSGI guard makes it problem+json."""
    for host in (b"evil.example", b"x", b"127.0.0.1:1:2"):
        raw = b"GET /api/v1/tasks HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"
        with Connection(server.port) as conn:
            conn.sock.sendall(raw)
            answer = conn.read_answer()
            # a kept connection must answer the next request on it
            answer.after = conn.state_after(answer, port_probe=PROBE)
        assert_handled(answer, host)
        assert (answer.status, answer.json()["code"]) == (400, "MALFORMED_REQUEST")


def test_the_server_log_holds_no_unhandled_error(server: Server, world: World) -> None:
    """Last in the module: every request above was answered without a traceback."""
    log = server.log()
    assert "Traceback" not in log, log[-5000:]
    assert "unhandled API error" not in log, log[-5000:]
