"""Gunicorn's workers for the portal, answering their own refusals as problem+json.

Gunicorn refuses some requests before Django sees them: a header over
``limit_request_field_size`` (431), a request line over ``limit_request_line``
(414), more than ``limit_request_fields`` headers (431), a request line or header
it cannot parse (400), a transfer coding it does not know (501). Its stock answer
is an HTML page. These workers keep gunicorn's statuses (but answer that 501 with
400), its log lines and its ``Connection: close``, and send the problem document
of the status instead (``portal.problems``), whatever the path: the request line
may not even have been read. ``gunicorn.conf.py`` selects one.

``ProblemThreadWorker`` (gunicorn's gthread: a few threads per process, idle
connections kept alive in the process's poller) is the one deployed;
``ProblemSyncWorker`` (one request per process, every answer closes) stays for
``PORTAL_WEB_WORKER_CLASS=sync``.

An answer given before the body was read (a 413, a 401, a 404 of a POST) leaves
the rest of the body unread. On a kept-alive connection those bytes would be read
as the next request, and closing a socket with unread data makes the kernel send
a reset, so a client still writing its body meets a broken pipe and can lose the
answer. So, when the application starts its answer (``early_answer_guard``), what
is left of the body is read away if it is small (``KEEP_DRAIN_MAX_BYTES``, within
``KEEP_DRAIN_MAX_S``) and the connection stays open; otherwise the answer says
``Connection: close``. After an answer that closes, the worker reads and discards
what is left of the body (``drain_body``: at most ``DRAIN_MAX_BYTES`` within
``DRAIN_MAX_S``), then closes as gunicorn does (FIN, then a short linger).

Imported by the gunicorn master before Django is set up: no Django imports here.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from http import HTTPStatus
from typing import Any

from gunicorn import util
from gunicorn.http import errors
from gunicorn.http.body import LengthReader
from gunicorn.http.wsgi import Response, default_environ
from gunicorn.workers.gthread import ThreadWorker
from gunicorn.workers.sync import SyncWorker

from portal.problems import PROBLEM_CONTENT_TYPE, encode, status_problem

# How much of an unread request body the worker reads away after an answer that
# closes, and for how long (the thread serves no one else meanwhile). Past either,
# it closes anyway and the client may see a reset.
DRAIN_MAX_BYTES = 64 * 1024 * 1024
DRAIN_MAX_S = 5.0

# How much unread body an answer may leave and still keep the connection: read
# away before the answer's head goes out. Gunicorn's own drain after a kept-alive
# answer stops at 64 KiB too, and then drops the connection it announced as kept.
KEEP_DRAIN_MAX_BYTES = 64 * 1024
KEEP_DRAIN_MAX_S = 1.0

# First match wins: gunicorn's own choice of status for each refusal.
_STATUSES: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...
] = (
    ((errors.InvalidResponseHeader, errors.InvalidResponseHeaderName), 500),
    (errors.ConfigurationProblem, 500),
    (errors.LimitRequestLine, 414),
    (errors.LimitRequestHeaders, 431),
    (errors.ExpectationFailed, 417),
    # Gunicorn (and RFC 9112, as a SHOULD) answers 501; a 5xx tells clients to
    # retry what can never succeed, so the portal answers 400.
    (errors.UnsupportedTransferCoding, 400),
    ((errors.ForbiddenProxyRequest, ssl.SSLError), 403),
    (errors.ParseException, 400),
)


def refusal_status(exc: BaseException) -> int:
    """The status gunicorn answers ``exc`` with; 500 for anything unforeseen."""
    for kinds, status in _STATUSES:
        if isinstance(exc, kinds):
            return status
    return 500


def problem_message(status: int) -> bytes:
    """A complete HTTP/1.1 answer: the problem document, then the connection closes."""
    body = encode(status_problem(status))
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "Connection: close\r\n"
        f"Content-Type: {PROBLEM_CONTENT_TYPE}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode("latin-1") + body


def drain_body(
    req: Any,
    client: Any,
    *,
    max_bytes: int = DRAIN_MAX_BYTES,
    max_s: float = DRAIN_MAX_S,
) -> bool:
    """Read and discard what is left of ``req``'s body; whether it all went."""
    return _drain(req.body, client, max_bytes=max_bytes, max_s=max_s)


def _drain(body: Any, client: Any, *, max_bytes: int, max_s: float) -> bool:
    if body is None:
        return True
    if getattr(body, "failed", False) is True:
        return False  # a broken chunk: where the body ends is unknown
    deadline = time.monotonic() + max_s
    drained = 0
    prior = client.gettimeout()
    try:
        while drained <= max_bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            client.settimeout(left)
            chunk = body.read(min(64 * 1024, max_bytes - drained + 1))
            if not chunk:
                return True
            drained += len(chunk)
    except (OSError, errors.ParseException):  # a broken chunk, a reset, a timeout
        return False
    finally:
        with contextlib.suppress(OSError):
            client.settimeout(prior)
    return False


def body_settled(environ: dict[str, Any]) -> bool:
    """Whether the request's body is all read, reading a small rest away first.

    False when more than ``KEEP_DRAIN_MAX_BYTES`` is left, when it does not arrive
    within ``KEEP_DRAIN_MAX_S``, or when the body is broken: the connection cannot
    carry another request then.
    """
    body = environ.get("wsgi.input")
    reader = getattr(body, "reader", None)
    if isinstance(reader, LengthReader) and reader.length > KEEP_DRAIN_MAX_BYTES:
        return False  # known to be too much: no need to wait for any of it
    client = environ.get("gunicorn.socket")
    if client is None:
        return False
    return _drain(body, client, max_bytes=KEEP_DRAIN_MAX_BYTES, max_s=KEEP_DRAIN_MAX_S)


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def early_answer_guard(app: WSGIApp) -> WSGIApp:
    """``app``, whose answers close the connection when they leave a body unread.

    Gunicorn's ``start_response`` is a bound method of the answer it builds; an
    answer forced to close says ``Connection: close`` in its head (a WSGI app may not
    set that hop-by-hop header itself: gunicorn drops it).
    """

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        def start(status: str, headers: Any, exc_info: Any = None) -> Any:
            if not body_settled(environ):
                answer = getattr(start_response, "__self__", None)
                if isinstance(answer, Response):
                    answer.force_close()
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return guarded


class ProblemRefusals:
    """``handle_error`` of gunicorn's workers, answering problem+json."""

    log: Any
    cfg: Any

    def handle_error(
        self, req: Any, client: Any, addr: Any, exc: BaseException
    ) -> None:
        # Naive local time, as gunicorn's own handle_error gives its access log.
        started = datetime.now()  # noqa: DTZ005
        addr = addr or ("", -1)  # a unix socket
        status = refusal_status(exc)
        message = problem_message(status)
        # The answer first: whatever the log lines below meet, the client has it.
        try:
            util.write_nonblock(client, message)
        except Exception:  # the client may be gone; nothing left to tell it  # noqa: BLE001
            self.log.debug("Failed to send the error answer.")
        if status < 500:
            self.log.warning("Invalid request from ip=%s: %s", addr[0], exc)
        elif req is not None and hasattr(req, "uri"):
            self.log.exception("Error handling request %s %s", req.method, req.uri)
        else:
            self.log.exception("Error handling request (no URI read)")
        if req is None and isinstance(
            exc, errors.InvalidHeader | errors.InvalidHeaderName
        ):
            req = getattr(exc, "req", None)  # a bad header may know its request
        if req is not None:
            environ = default_environ(req, client, self.cfg)
            environ["REMOTE_ADDR"] = addr[0]
            environ["REMOTE_PORT"] = str(addr[1])
            response = Response(req, client, self.cfg)
            response.status = f"{status} {HTTPStatus(status).phrase}"
            response.response_length = len(message)
            self.log.access(
                response,
                req,
                environ,
                datetime.now() - started,  # noqa: DTZ005
            )


class ProblemSyncWorker(ProblemRefusals, SyncWorker):
    def handle_request(self, listener: Any, req: Any, client: Any, addr: Any) -> None:
        super().handle_request(listener, req, client, addr)
        # Answered (any error went up instead): the client may still be sending.
        drain_body(req, client)


class ProblemThreadWorker(ProblemRefusals, ThreadWorker):
    """Gunicorn's threaded worker: connections kept alive between requests."""

    wsgi: Any

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi = early_answer_guard(self.wsgi)

    def handle_request(self, req: Any, conn: Any) -> bool:
        keep = bool(super().handle_request(req, conn))
        if not keep:
            # The answer said Connection: close; the client may still be sending.
            drain_body(req, conn.sock)
        return keep
