"""A raw HTTP/1.1 client: any bytes out, the answer and the connection's state back.

httpx and the test client refuse to send what these tests must send (TRACE with
a body, unknown methods, NUL bytes, broken percent-encodings, 10 KB headers), and
they hide what the connection did afterwards. This speaks HTTP/1.1 over a plain
socket and reports both.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 30.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps the last
    body: bytes
    # What the connection did after the answer: "open" (a second request on it was
    # answered), "closed" (the server closed it cleanly: FIN), "reset" (RST).
    after: str = ""
    raw_head: bytes = field(default=b"", repr=False)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        """Send, ignoring a server that stopped reading (it may answer anyway)."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def _read_until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if not self._fill():
                raise ConnectionError(
                    f"closed before {marker!r}: {self.buffer[:200]!r}"
                )
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    def _read_exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._fill():
                raise ConnectionError("closed inside a body")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def read_answer(self, *, head_request: bool = False) -> Answer:
        head = self._read_until(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, status, *_ = status_line.split(" ", 2)
        assert version in ("HTTP/1.1", "HTTP/1.0"), status_line
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if head_request or int(status) in (204, 304) or 100 <= int(status) < 200:
            body = b""
        elif "content-length" in headers:
            body = self._read_exactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._read_until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._read_until(b"\r\n")
                    break
                body += self._read_exactly(size)
                self._read_exactly(2)
        else:  # delimited by the close
            while self._fill():
                pass
            body, self.buffer = self.buffer, b""
        return Answer(int(status), headers, body, raw_head=head)

    def state_after(self, answer: Answer, *, port_probe: bytes) -> str:
        """Whether the connection is still usable, or how the server ended it."""
        if answer.headers.get("connection", "").lower() == "close":
            try:
                while self._fill():
                    if self.buffer.strip():
                        return "garbage"  # bytes after an answer that said close
            except ConnectionResetError:
                return "reset"
            return "closed"
        self.send(port_probe)
        try:
            follow = self.read_answer()
        except (ConnectionError, OSError):
            return "dropped"  # kept open by the headers, but not usable
        return "open" if follow.status < 500 else f"follow-up {follow.status}"


PROBE = b"GET /api/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def exchange(port: int, request: bytes, *, head_request: bool = False) -> Answer:
    """Send one request on a new connection; the answer and what the connection did."""
    with Connection(port) as conn:
        conn.send(request)
        answer = conn.read_answer(head_request=head_request)
        answer.after = conn.state_after(answer, port_probe=PROBE)
        return answer


def request_bytes(
    method: str | bytes,
    target: str | bytes,
    *,
    headers: Mapping[str, str | bytes] | None = None,
    body: bytes = b"",
    keep_alive: bool = True,
) -> bytes:
    """A request; ``Content-Length`` is added for a body unless a header names one."""

    def raw(value: str | bytes) -> bytes:
        return value if isinstance(value, bytes) else value.encode("latin-1")

    lines = [raw(method) + b" " + raw(target) + b" HTTP/1.1", b"Host: 127.0.0.1"]
    names = {name.lower() for name in (headers or {})}
    for name, value in (headers or {}).items():
        lines.append(raw(name) + b": " + raw(value))
    if body and "content-length" not in names and "transfer-encoding" not in names:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    if not keep_alive:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
