"""Kept-alive connections on the real gunicorn, as ``gunicorn.conf.py`` runs it.

Agents hold their connections: an answer that says ``Connection: keep-alive`` must
be followed by another answer on the same connection, also after an answer given
before the body was read (a 401 with no key, a 413). Such an answer either read the
rest of the body away (a small one: the connection stays) or says
``Connection: close`` and then ends the connection with a FIN, never a reset under a
client still writing (config/gunicorn_worker.py). No answer is a 5xx, also with
many clients at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from .conftest import Server, World, _serve
from .raw import PROBE, Answer, Connection, request_bytes
from .test_no_5xx import LIMIT, assert_handled


@pytest.fixture(scope="module")
def plain_server(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """DEBUG off: keep-alive is the worker's, not Django's debug mode's."""
    yield from _serve(False, tmp_path_factory)


def _tasks(world: World) -> bytes:
    return request_bytes("GET", "/api/v1/tasks", headers={"Authorization": world.auth})


def _post(body: bytes, *, auth: str | None = None, chunked: bool = False) -> bytes:
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return request_bytes("POST", "/api/v1/tasks", headers=headers, body=body)


def _json_body(size: int) -> bytes:
    body = b'{"input": "' + b"x" * (size - 13) + b'"}'
    assert len(body) == size
    return body


def test_one_connection_carries_many_requests(
    plain_server: Server, world: World
) -> None:
    # Given one TCP connection
    with Connection(plain_server.port) as conn:
        # When ten requests go one after another over it
        answers = []
        for _ in range(10):
            conn.send(_tasks(world))
            answers.append(conn.read_answer())
    # Then each is answered and each answer keeps the connection
    assert [a.status for a in answers] == [200] * 10
    assert {a.headers["connection"] for a in answers} == {"keep-alive"}


def test_pipelined_requests_are_answered_in_order(
    plain_server: Server, world: World
) -> None:
    with Connection(plain_server.port) as conn:
        conn.send(_tasks(world) + _post(b"{}") + _tasks(world))
        answers = [conn.read_answer() for _ in range(3)]
    assert [a.status for a in answers] == [200, 401, 200]
    assert all(a.headers["connection"] == "keep-alive" for a in answers)


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
@pytest.mark.parametrize("size", [20, 1_000, 60_000])
def test_an_early_401_with_a_small_body_keeps_the_connection(
    plain_server: Server, world: World, size: int, chunked: bool
) -> None:
    """The 401 is decided before Django reads the body; the worker reads the small
    rest away before answering, so the next request on the connection is parsed from
    its own first byte (a body left in the socket would be read as a request)."""
    # Given a POST without a key, its body sent whole, and the next request behind it
    with Connection(plain_server.port) as conn:
        conn.send(_post(_json_body(size), chunked=chunked) + _tasks(world))
        first = conn.read_answer()
        second = conn.read_answer()
        first.after = conn.state_after(second, port_probe=PROBE)
    # Then the 401 kept the connection and the next request was answered on it
    assert (first.status, first.json()["code"]) == (401, "UNAUTHENTICATED")
    assert first.headers["connection"] == "keep-alive"
    assert second.status == 200, second
    assert first.after == "open"


@pytest.mark.parametrize("authorized", [True, False], ids=["413", "401"])
def test_an_early_answer_with_a_large_body_closes_cleanly(
    plain_server: Server, world: World, authorized: bool
) -> None:
    """Past 64 KiB of unread body the worker does not wait for it: the answer says
    close, the rest is read away, then FIN."""
    body = _json_body(LIMIT + 1)
    with Connection(plain_server.port) as conn:
        conn.send(_post(body, auth=world.auth if authorized else None))
        answer = conn.read_answer()
        answer.after = conn.state_after(answer, port_probe=PROBE)
    assert_handled(answer, authorized)
    assert answer.status == (413 if authorized else 401)
    assert answer.headers["connection"] == "close"
    assert answer.after == "closed"


def test_a_client_stalling_inside_its_body_gets_an_answer_that_closes(
    plain_server: Server, world: World
) -> None:
    """A body that does not arrive within a second is not waited for: the 401 says
    close instead of holding the thread, and the connection then ends with a FIN."""
    head = _post(b"{}")[: -len(b"{}")].replace(
        b"Content-Length: 2", b"Content-Length: 1000"
    )
    with Connection(plain_server.port) as conn:
        conn.send(head + b"x" * 500)  # half the body, then nothing
        started = time.monotonic()
        answer = conn.read_answer()
        waited = time.monotonic() - started
        conn.sock.shutdown(1)  # the client gives up writing
        answer.after = conn.state_after(answer, port_probe=b"")
    assert (answer.status, answer.headers["connection"]) == (401, "close")
    assert answer.after == "closed"
    assert waited < 10, waited


def test_many_keep_alive_clients_at_once_see_no_5xx_and_no_dropped_connection(
    plain_server: Server, world: World
) -> None:
    """Eight clients, each on its own connection, mixing good requests, early 401s
    with small bodies and 413s: a connection is only ever ended after an answer that
    said close, and only those open a new one."""
    clients, rounds = 8, 12
    mix = [
        (_tasks(world), 200),
        (_post(_json_body(2_000)), 401),
        (_tasks(world), 200),
        (_post(_json_body(LIMIT + 1), auth=world.auth), 413),
    ]
    failures: list[object] = []
    reconnects: list[int] = []
    answers: list[Answer] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        opened = 1
        conn = Connection(plain_server.port)
        try:
            for step in range(rounds):
                data, expected = mix[(index + step) % len(mix)]
                conn.send(data)
                answer = conn.read_answer()
                with lock:
                    answers.append(answer)
                if answer.status != expected:
                    failures.append((index, step, answer.status, answer.body[:200]))
                if answer.headers.get("connection") == "close":
                    answer.after = conn.state_after(answer, port_probe=b"")
                    if answer.after != "closed":
                        failures.append((index, step, answer.after))
                    conn.close()
                    conn = Connection(plain_server.port)
                    opened += 1
        except (OSError, ConnectionError, AssertionError) as error:
            failures.append((index, repr(error)))
        finally:
            conn.close()
            with lock:
                reconnects.append(opened)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert len(answers) == clients * rounds
    assert all(a.status < 500 for a in answers)
    # Only the 413s (one request in four) closed their connections.
    closed = sum(a.headers.get("connection") == "close" for a in answers)
    assert closed == sum(a.status == 413 for a in answers) == clients * rounds // 4
    assert sum(reconnects) == clients + closed
