"""The ticket desk's HTTP interface: routes, validation, credentials and faults.

HTTP/1.0, one request per connection: a dropped response then always means "this
request", never a pooled connection that a client might silently retry. Given an
``ssl.SSLContext``, the server speaks https: each connection's TLS handshake runs in
its own thread, and a failed one ends that connection only.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.trace import SpanKind

from . import credentials
from .store import (
    DEFAULT_DELAY_S,
    DEFAULT_RETRY_AFTER_S,
    FAULT_MODES,
    Desk,
    Fault,
    IdempotencyKeyReused,
    JtiSpent,
)

MAX_BODY_BYTES: Final = 1_048_576
MAX_KEY_LENGTH: Final = 200
MAX_DELAY_S: Final = 120.0
# The target name the portal's connector uses for this desk: a credential's ``aud``.
DEFAULT_AUDIENCE: Final = "ticket-desk"
# Seconds a client has to finish the TLS handshake; a silent one then frees its thread.
TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0
_TRACER: Final = trace.get_tracer("ticketdesk")
_TICKET_PATH: Final = re.compile(r"/tickets/(?P<ticket_id>[^/]+)")
_LOOKUP_ACTIONS: Final = (credentials.ACTION_CREATE, credentials.ACTION_LOOKUP)
# Create faults that make the ticket, then answer in a way not to be trusted.
_HOSTILE: Final = frozenset(
    {"redirect", "oversize", "malformed", "foreign_key", "foreign_tenant", "drip"}
)
# The padding of an ``oversize`` answer: far over any client's sensible limit.
OVERSIZE_BYTES: Final = 2 * 1024 * 1024
# Create faults that answer at once, before the credential is even read.
_REFUSALS: Final = frozenset({"error_5xx", "rate_limited", "reject"})
# Body members and their JSON types; anything else is refused, not ignored.
_BODY_TYPES: Final[dict[str, type | tuple[type, ...]]] = {
    "queue": str,
    "summary": str,
    "customer": str,
    "amount": (int, float),  # a refund's amount (docs/policies.md's example)
    "object": dict,
    "fields": dict,
}
_JSON_TYPES: Final[dict[type | tuple[type, ...], str]] = {
    str: "string",
    dict: "object",
}


class BadRequest(Exception):
    """The request cannot be served as sent."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def in_network_namespace(name: str) -> bool:
    """True when this process runs in the named network namespace (``ip netns
    add NAME``, bound at /run/netns/NAME): a test's private network
    (tests/support/netns.py), reached only over the veth pair root made for it,
    where the desk may listen on that namespace's address instead of loopback."""
    try:
        here = os.stat("/proc/self/ns/net")
        named = os.stat(f"/run/netns/{name}")
    except (OSError, ValueError):
        return False
    return (here.st_dev, here.st_ino) == (named.st_dev, named.st_ino)


class TicketDeskServer(ThreadingHTTPServer):
    """A threaded HTTP server holding the desk's state and trusted public keys;
    https when given ``tls``, a server-side context holding the certificate chain."""

    daemon_threads = True  # a slow fault's sleeping thread must not delay exit
    # The default backlog of 5 drops a burst of concurrent connects, and each
    # dropped SYN costs the client a second before it tries again.
    request_queue_size = 128

    def __init__(
        self,
        host: str,
        port: int,
        *,
        keys_path: Path,
        audience: str = DEFAULT_AUDIENCE,
        tls: ssl.SSLContext | None = None,
        netns: str | None = None,
    ) -> None:
        # Any address of a test's private network namespace is as closed as
        # loopback: only the veth pair root made for it reaches it.
        if not is_loopback(host) and not (netns and in_network_namespace(netns)):
            raise ValueError(f"the ticket desk binds loopback only, not {host!r}")
        if host == "localhost":
            host = "127.0.0.1"
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.desk = Desk()
        self.keys = credentials.KeyRing(keys_path)
        self.audience = audience
        self.tls = tls
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        shown = f"[{host}]" if self.address_family == socket.AF_INET6 else str(host)
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://{shown}:{port}"

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept a connection; with TLS, wrap it without the handshake, which
        ``finish_request`` does in the connection's own thread: the accepting
        loop never waits on one client."""
        connection, address = super().get_request()
        if self.tls is None:
            return connection, address
        wrapped = self.tls.wrap_socket(
            connection, server_side=True, do_handshake_on_connect=False
        )
        return wrapped, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Serve one connection, after its TLS handshake when it has one; a failed
        or timed-out handshake is logged in one line and ends this connection."""
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(TLS_HANDSHAKE_TIMEOUT_S)
            try:
                request.do_handshake()
            except OSError as error:  # ssl.SSLError, a reset, a timeout
                sys.stderr.write(f"{client_address[0]} - - TLS handshake: {error}\n")
                return
            request.settimeout(None)  # as accepted: the handler reads blocking
        super().finish_request(request, client_address)


def _validated_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest(400, "invalid_request", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "invalid_request", "the body is not a JSON object")
    problems = [f"unknown member {name!r}" for name in body if name not in _BODY_TYPES]
    for name, kind in _BODY_TYPES.items():
        if name in body and (
            not isinstance(body[name], kind) or isinstance(body[name], bool)
        ):
            json_type = _JSON_TYPES.get(kind, "number")
            problems.append(f"{name} must be a JSON {json_type}")
    problems.extend(
        f"{name} is required" for name in ("queue", "summary") if not body.get(name)
    )
    ref = body.get("object")
    if isinstance(ref, dict) and (
        set(ref) != {"type", "id"}
        or not all(isinstance(value, str) and value for value in ref.values())
    ):
        problems.append("object must be {type: string, id: string}")
    if problems:
        raise BadRequest(400, "invalid_request", "; ".join(problems))
    return body


def _spent_error(spent: JtiSpent) -> credentials.CredentialError:
    if spent.why == "revoked":
        return credentials.CredentialRevoked()
    return credentials.CredentialReplayed()


def _validated_fault(raw: bytes) -> Fault:
    try:
        spec = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest(400, "invalid_request", "the body is not JSON") from None
    if not isinstance(spec, dict) or spec.get("mode") not in FAULT_MODES:
        modes = ", ".join(sorted(FAULT_MODES))
        raise BadRequest(400, "invalid_request", f"mode must be one of: {modes}")
    times = spec.get("times", 1)
    delay_s = spec.get("delay_s", DEFAULT_DELAY_S)
    retry_after_s = spec.get("retry_after_s", DEFAULT_RETRY_AFTER_S)
    if isinstance(times, bool) or not isinstance(times, int) or times < 0:
        raise BadRequest(400, "invalid_request", "times must be an integer >= 0")
    if (
        isinstance(delay_s, bool)
        or not isinstance(delay_s, int | float)
        or not 0 <= delay_s <= MAX_DELAY_S
    ):
        detail = f"delay_s must be a number from 0 to {MAX_DELAY_S:g}"
        raise BadRequest(400, "invalid_request", detail)
    if (
        isinstance(retry_after_s, bool)
        or not isinstance(retry_after_s, int)
        or retry_after_s < 0
    ):
        raise BadRequest(
            400, "invalid_request", "retry_after_s must be an integer >= 0"
        )
    return Fault(
        mode=spec["mode"],
        times=times,
        delay_s=float(delay_s),
        retry_after_s=retry_after_s,
    )


class Handler(BaseHTTPRequestHandler):
    """One request: route it, answer JSON, or drop the connection when told to."""

    server: TicketDeskServer
    server_version = "ticketdesk/1"

    # -- plumbing ---------------------------------------------------------------

    def _send(
        self, status: int, payload: Any, headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(
        self,
        status: int,
        error: str,
        detail: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._send(status, {"error": error, "detail": detail}, headers)

    def _read_body(self) -> bytes:
        # Read it all before answering: closing on an unread body makes the kernel
        # reset the connection, and the client could lose the answer.
        length_header = self.headers.get("Content-Length", "0")
        try:
            length = int(length_header)
        except ValueError:
            raise BadRequest(400, "invalid_request", "bad Content-Length") from None
        if length < 0:
            raise BadRequest(400, "invalid_request", "bad Content-Length")
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise BadRequest(413, "too_large", f"the limit is {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length)

    def _claims(self) -> dict[str, Any]:
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise credentials.CredentialInvalid("no Bearer credential")
        return credentials.verify(
            token.strip(), self.server.keys, audience=self.server.audience
        )

    def _spend(self, claims: dict[str, Any]) -> None:
        """Use the credential up for this request (the replay cache)."""
        try:
            self.server.desk.spend(jti=claims["jti"], exp=claims["exp"])
        except JtiSpent as spent:
            raise _spent_error(spent) from None

    def _dispatch(self, method: str) -> None:
        """Serve one request in a SERVER span continuing the caller's
        ``traceparent`` (recorded when ``python -m ticketdesk`` exports spans)."""
        url = urlsplit(self.path)
        with _TRACER.start_as_current_span(
            f"{method} {url.path}",
            context=extract(dict(self.headers.items())),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": url.path},
        ):
            self._route(method, url.path, url.query)

    def _route(self, method: str, path: str, query: str) -> None:
        routes = {
            ("POST", "/tickets"): self._create,
            ("GET", "/tickets"): self._lookup,
            ("GET", "/_control/effects"): self._effects,
            ("GET", "/_control/tickets"): self._all_tickets,
            ("POST", "/credentials/revocations"): self._revoke,
            ("POST", "/_control/reset"): self._reset,
            ("GET", "/_control/faults"): self._faults,
            ("POST", "/_control/faults"): self._arm_fault,
            ("DELETE", "/_control/faults"): self._clear_faults,
        }
        try:
            body = self._read_body()
            route = routes.get((method, path))
            ticket_path = _TICKET_PATH.fullmatch(path)
            if route is not None:
                route(body=body, query=query)
            elif method == "GET" and ticket_path:
                self._get(ticket_id=ticket_path["ticket_id"])
            elif ticket_path or path in {known for _, known in routes}:
                self._send_error(405, "method_not_allowed", f"{method} {path}")
            else:
                self._send_error(404, "not_found", f"no route {path}")
        except BadRequest as error:
            self._send_error(error.status, error.error, error.detail)
        except credentials.CredentialError as error:
            headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
            self._send_error(error.status, error.code, error.detail, headers)
        except (BrokenPipeError, ConnectionResetError):
            # A client that timed out (a slow fault) has gone; the work is done.
            self.close_connection = True
            self.log_message('"%s" answer not delivered', self.requestline)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    # -- business API -----------------------------------------------------------

    def _create(self, *, body: bytes, query: str) -> None:
        """POST /tickets: fault, credential, key, body, scope, then create or replay.

        Nothing before ``desk.create`` changes state, so every refusal leaves the key
        free for a retry.
        """
        desk = self.server.desk
        desk.count_request("create")
        fault = desk.take_fault("create")
        mode = fault.mode if fault is not None else None
        if fault is not None and fault.mode == "slow":
            # The work happens after the delay, even if the client has given up.
            time.sleep(fault.delay_s)
        elif fault is not None and fault.mode in _REFUSALS:
            self._refuse(fault)
            return
        claims = self._claims()
        key = self.headers.get("Idempotency-Key")
        if key is None:
            raise BadRequest(400, "idempotency_key_missing", "send Idempotency-Key")
        if not 1 <= len(key) <= MAX_KEY_LENGTH:
            detail = f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters"
            raise BadRequest(400, "idempotency_key_invalid", detail)
        parsed = _validated_body(body)
        credentials.check_call(
            claims,
            use=credentials.USE_EXECUTE,
            actions=(credentials.ACTION_CREATE,),
            idempotency_key=key,
            # The grant names one object, so the body must name it too.
            object_ref=parsed.get("object", {}),
            fields=parsed.get("fields", {}).keys(),
            body=body,
        )
        try:
            result = desk.create(
                tenant=str(claims["tenant"]),
                idempotency_key=key,
                body=parsed,
                credential_jti=claims["jti"],
                credential_exp=claims["exp"],
                copies=2 if mode == "duplicate" else 1,
            )
        except JtiSpent as spent:
            raise _spent_error(spent) from None
        except IdempotencyKeyReused:
            detail = "this Idempotency-Key was first used with another body"
            raise BadRequest(422, "idempotency_key_reused", detail) from None
        if mode == "execute_then_drop":
            # Nothing is written: the client reads an empty reply on a closed socket.
            self.close_connection = True
            self.log_message('"%s" dropped after the side effect', self.requestline)
            return
        if mode == "after_5xx":
            self._send_error(500, "internal", "fault: after_5xx")
            return
        if mode in _HOSTILE:
            delay_s = fault.delay_s if fault is not None else DEFAULT_DELAY_S
            self._hostile(mode, result.ticket.as_json(), delay_s=delay_s)
            return
        if result.created:
            self._send(201, result.ticket.as_json())
        else:
            self._send(200, result.ticket.as_json(), {"Idempotent-Replayed": "true"})

    def _hostile(self, mode: str, ticket: dict[str, Any], *, delay_s: float) -> None:
        """Answer a create that happened in a way no client should trust."""
        if mode == "redirect":
            self._send(303, {}, {"Location": f"{self.server.url}/tickets/elsewhere"})
        elif mode == "oversize":
            self._send(201, {**ticket, "padding": "x" * OVERSIZE_BYTES})
        elif mode == "malformed":
            data = json.dumps(ticket).encode("utf-8")[:40]
            self._send_raw(201, data)
        elif mode == "foreign_key":
            other = "another-key"
            receipt = {**ticket["receipt"], "idempotency_key": other}
            self._send(
                201,
                {
                    **ticket,
                    "idempotency_key": other,
                    "receipt": receipt,
                    "ticket_id": "TCK-999999",
                },
            )
        elif mode == "foreign_tenant":
            self._send(
                201, {**ticket, "tenant": "another-tenant", "ticket_id": "TCK-999998"}
            )
        else:  # drip: the whole answer, status line first, a byte per delay_s
            data = json.dumps(ticket).encode("utf-8")
            head = (
                f"{self.protocol_version} 201 Created\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n"
            ).encode("ascii")
            self.close_connection = True
            self.log_message('"%s" dripped', self.requestline)
            for byte in head + data:
                time.sleep(delay_s)
                self.wfile.write(bytes([byte]))
                self.wfile.flush()

    def _send_raw(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, fault: Fault) -> None:
        """Answer as ``fault`` says, having done nothing."""
        if fault.mode == "rate_limited":
            headers = {"Retry-After": str(fault.retry_after_s)}
            self._send_error(429, "rate_limited", "fault: rate_limited", headers)
        elif fault.mode == "reject":
            self._send_error(422, "rejected", "fault: reject")
        else:
            self._send_error(503, "unavailable", f"fault: {fault.mode}")

    def _lookup_fault(self) -> None:
        """Count a lookup and apply its fault; raise if the fault answers for it."""
        desk = self.server.desk
        desk.count_request("lookup")
        fault = desk.take_fault("lookup")
        if fault is None:
            return
        if fault.mode == "lookup_slow":
            time.sleep(fault.delay_s)
        elif fault.mode == "lookup_5xx":
            raise BadRequest(503, "unavailable", "fault: lookup_5xx")

    def _lookup(self, *, body: bytes, query: str) -> None:
        self._lookup_fault()
        claims = self._claims()
        params = {name: values[-1] for name, values in parse_qs(query).items()}
        key = params.get("idempotency_key")
        object_type = params.get("object_type")
        object_id = params.get("object_id")
        if (object_type is None) != (object_id is None):
            detail = "object_type and object_id go together"
            raise BadRequest(400, "invalid_request", detail)
        if key is None and object_type is None:
            detail = "give idempotency_key, or object_type and object_id"
            raise BadRequest(400, "invalid_request", detail)
        object_ref = None
        if object_type is not None:
            object_ref = {"type": object_type, "id": object_id}
        credentials.check_call(
            claims,
            use=credentials.USE_LOOKUP,
            actions=_LOOKUP_ACTIONS,
            idempotency_key=key,
            object_ref=object_ref,
        )
        self._spend(claims)
        tickets = self.server.desk.find(
            tenant=str(claims["tenant"]),
            idempotency_key=key,
            object_type=object_type,
            object_id=object_id,
        )
        self._send(200, {"tickets": [ticket.as_json() for ticket in tickets]})

    def _get(self, *, ticket_id: str) -> None:
        self._lookup_fault()
        claims = self._claims()
        credentials.check_call(
            claims, use=credentials.USE_LOOKUP, actions=_LOOKUP_ACTIONS
        )
        self._spend(claims)
        ticket = self.server.desk.get(tenant=str(claims["tenant"]), ticket_id=ticket_id)
        if ticket is None:
            raise BadRequest(404, "not_found", f"no ticket {ticket_id}")
        self._send(200, ticket.as_json())

    def _revoke(self, *, body: bytes, query: str) -> None:
        """POST /credentials/revocations: the portal revokes credentials it issued.

        The notice is itself a single-use token (``use: revoke``) whose ``revokes``
        claim lists ``{jti, exp}``; the body is ignored.
        """
        claims = self._claims()
        if claims["use"] != credentials.USE_REVOKE:
            raise credentials.CredentialScope("not a revocation notice")
        self._spend(claims)
        fresh = self.server.desk.revoke(credentials=claims["revokes"])
        self._send(200, {"revoked": len(claims["revokes"]), "unused": fresh})

    # -- control API (loopback only, no credential) -----------------------------

    def _effects(self, *, body: bytes, query: str) -> None:
        self._send(200, self.server.desk.effects())

    def _all_tickets(self, *, body: bytes, query: str) -> None:
        tickets = self.server.desk.all_tickets()
        self._send(200, {"tickets": [ticket.as_json() for ticket in tickets]})

    def _reset(self, *, body: bytes, query: str) -> None:
        self.server.desk.reset()
        self._send(200, self.server.desk.effects())

    def _faults(self, *, body: bytes, query: str) -> None:
        self._send(200, {"faults": self.server.desk.faults()})

    def _arm_fault(self, *, body: bytes, query: str) -> None:
        self.server.desk.arm_fault(_validated_fault(body))
        self._send(201, {"faults": self.server.desk.faults()})

    def _clear_faults(self, *, body: bytes, query: str) -> None:
        self.server.desk.clear_faults()
        self._send(200, {"faults": []})
