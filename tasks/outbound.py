"""The outbound URL policy: which addresses the gateway may call (SSRF).

A connector's URL is a tenant admin's input, and the gateway calls it from inside
the portal's network: without a policy an admin could make it call the portal's own
neighbours (a control endpoint on localhost, a cloud metadata service). The rules
(docs/gateway.md, "Outbound URL policy"):

- ``https`` only; ``http`` only in development (``PORTAL_DEV_MODE``), and only for a
  ``host:port`` named in ``PORTAL_OUTBOUND_ALLOWED_HOSTS``;
- a host whose address is not public (loopback, private, link-local, shared,
  multicast, reserved, unspecified, a metadata service; IPv4 inside IPv6 judged as
  the IPv4) is refused unless that exact ``host:port`` is in the allow-list;
- connector paths are relative, so every request stays under the base URL.

Two walls. At save time (``base_url_problem``, ``path_problem``) the URL's text is
checked, with no DNS lookup (no network I/O in the saving transaction): an early,
helpful error. At call time (``transport``) is the boundary: each connection
resolves its host once, checks every address, and connects to an address it
checked, never resolving again; TLS still verifies the certificate for the name
(httpcore sends the URL's host as SNI). A refusal raises ``OutboundRefused``
before any byte is sent.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final
from urllib.parse import SplitResult, urlsplit

import httpcore
import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .exceptions import OutboundRefused

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# Cloud metadata and platform services, refused by address even where the range
# they sit in would not be (Azure's wire server is a public address).
METADATA_ADDRESSES: Final = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, ...
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server
    )
)
# RFC 6598 shared address space (carrier-grade NAT): not global, not "private".
SHARED_NETWORK: Final = ipaddress.ip_network("100.64.0.0/10")
NAT64_NETWORK: Final = ipaddress.ip_network("64:ff9b::/96")
# One DNS label; a host is a name only if its last label is not all digits (so
# "2130706433", "127.1" or "0x7f.1", which resolvers read as addresses, are no names).
_LABEL: Final = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_NUMERIC_LABEL: Final = re.compile(r"(0x[0-9a-f]*|[0-9]+)")
# Encoded dots, slashes and backslashes a server might decode into a traversal.
_ENCODED_SEPARATORS: Final = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)
_CONTROL_OR_SPACE: Final = re.compile(r"[\x00-\x20\x7f]")


def _system_resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order."""
    found: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 zone is no address
        if address not in found:
            found.append(address)
    return found


# The one resolution a connection makes. Module level so a test can make a name
# resolve as it likes (tests/gateway/test_outbound_policy.py); nothing else does.
resolve: Callable[[str, int], list[str]] = _system_resolve


def allowed_hosts() -> frozenset[str]:
    """``PORTAL_OUTBOUND_ALLOWED_HOSTS`` as canonical ``host:port`` entries.

    Raises:
        ImproperlyConfigured: an entry without a port, or not a host and port.
    """
    entries = set()
    for entry in settings.PORTAL_OUTBOUND_ALLOWED_HOSTS:
        try:
            parts = urlsplit(f"//{entry.strip()}")
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            raise ImproperlyConfigured(
                f"PORTAL_OUTBOUND_ALLOWED_HOSTS: {entry!r} is not host:port"
            )
        entries.add(_entry(parts.hostname, port))
    return frozenset(entries)


def _entry(host: str, port: int) -> str:
    host = host.lower().strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_port(url: str | httpx.URL) -> str:
    """The allow-list entry naming ``url``'s host and port (default port filled in)."""
    parsed = httpx.URL(str(url))
    port = parsed.port or DEFAULT_PORTS.get(parsed.scheme, 0)
    return _entry(parsed.host, port)


def address_problem(address: str | Address) -> str | None:
    """Why the gateway may not connect to ``address``, or None for a public one."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in NAT64_NETWORK else None
        )
        if embedded is not None:
            return address_problem(embedded)
        if ip.sixtofour is not None or ip.teredo is not None:
            return "a tunnelled IPv4 address"
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    checks = (
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_private, "a private address"),
        (
            isinstance(ip, ipaddress.IPv4Address) and ip in SHARED_NETWORK,
            "a shared (carrier-grade NAT) address",
        ),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a public address"),
    )
    return next((why for refused, why in checks if refused), None)


def _host_problem(host: str) -> str | None:
    """What the text of a host says about it, without resolving it."""
    try:
        return address_problem(host.strip("[]"))
    except ValueError:
        pass
    if host == "localhost" or host.endswith(".localhost"):
        return "a loopback name (RFC 6761)"
    labels = host.rstrip(".").split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return "not a valid host name"
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        return "an address written as a number, not a name or a dotted address"
    return None


def origin_problem(*, scheme: str, host: str, port: int | None) -> str | None:
    """Whether the policy lets the gateway call ``scheme://host:port`` (no DNS)."""
    if scheme not in DEFAULT_PORTS:
        return f"the scheme must be https, not {scheme or 'none'}"
    if not host:
        return "the URL names no host"
    allowed = _entry(host, port or DEFAULT_PORTS[scheme]) in allowed_hosts()
    if scheme == "http" and not (settings.DEV_MODE and allowed):
        return (
            "the scheme must be https (http only in development, for a host:port "
            "named in PORTAL_OUTBOUND_ALLOWED_HOSTS)"
        )
    problem = None if allowed else _host_problem(host.lower())
    if problem:
        return (
            f"{host} is {problem}: the gateway calls such a host only when its "
            "host:port is named in PORTAL_OUTBOUND_ALLOWED_HOSTS"
        )
    return None


def base_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a connector's base URL, or None.

    Absolute, ``https`` (or ``http`` for an allowed development host), no user
    information, query or fragment, and a host the policy allows by its text.
    """
    if _CONTROL_OR_SPACE.search(url) or "\\" in url:
        return "the URL may not hold spaces, control characters or backslashes"
    try:
        parts: SplitResult = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a URL with a valid host and port"
    if not parts.scheme or not parts.netloc:
        return "the URL must be absolute: https://host[:port][/path]"
    if "@" in parts.netloc:
        return "the URL may not carry a user name or password"
    if "?" in url or "#" in url:
        return "the URL may not carry a query or fragment"
    if parts.path and (problem := path_problem(parts.path)):
        return problem
    return origin_problem(
        scheme=parts.scheme.lower(), host=parts.hostname or "", port=port
    )


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a connector path (relative to the base URL), or None."""
    if not path.startswith("/"):
        return "the path must start with /"
    if "//" in path:
        return "the path may not hold // (it could name another host)"
    if _CONTROL_OR_SPACE.search(path) or "\\" in path:
        return "the path may not hold spaces, control characters or backslashes"
    if "@" in path:
        return "the path may not hold @ (it could name another host)"
    if "?" in path or "#" in path:
        return "the path may not carry a query or fragment"
    if _ENCODED_SEPARATORS.search(path):
        return "the path may not hold encoded dots, slashes or backslashes"
    if any(segment in (".", "..") for segment in path.split("/")):
        return "the path may not hold . or .. segments"
    return None


def connector_url_problems(values: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(setting, problem)`` for each of a connector's ``base_url``,
    ``execute_path`` and ``lookup_path`` in ``values`` that the policy refuses."""
    problems = []
    for name, value in values.items():
        problem = base_url_problem(value) if name == "base_url" else path_problem(value)
        if problem:
            problems.append((name, problem))
    return problems


def url_for(base_url: str, path: str) -> str:
    """The URL of a connector request: ``path`` under ``base_url``, both checked.

    Raises:
        OutboundRefused: the base URL or the path breaks the policy.
    """
    problem = base_url_problem(base_url) or path_problem(path)
    if problem:
        raise OutboundRefused(problem, host=urlsplit(base_url).hostname, path=path)
    return base_url.rstrip("/") + path


def connect_addresses(host: str, port: int) -> list[str]:
    """Resolve ``host`` once and check every address; the ones a connection may use.

    Raises:
        OutboundRefused: an address is not public and ``host:port`` is not in
            ``PORTAL_OUTBOUND_ALLOWED_HOSTS`` (one bad address refuses the name: a
            client may not pick which one it reaches).
        httpcore.ConnectError: the name does not resolve.
    """
    try:
        addresses = resolve(host, port)
    except OSError as error:
        raise httpcore.ConnectError(f"cannot resolve {host}: {error}") from error
    if not addresses:
        raise httpcore.ConnectError(f"{host} resolves to no address")
    if _entry(host, port) in allowed_hosts():
        return addresses
    for address in addresses:
        if problem := address_problem(address):
            raise OutboundRefused(
                f"{host} resolves to {address}, {problem}: the gateway calls such "
                "a host only when its host:port is named in "
                "PORTAL_OUTBOUND_ALLOWED_HOSTS",
                host=host,
                port=port,
                addresses=addresses,
            )
    return addresses


class PinnedBackend(httpcore.NetworkBackend):
    """httpcore's network backend, connecting only to addresses the policy checked.

    ``connect_tcp`` gets the URL's host: it resolves it once (``resolve``), checks
    every address, and hands the checked address itself to the socket, so no second
    resolution can lead elsewhere. TLS is started by httpcore on the stream with the
    URL's host as ``server_hostname``: SNI and certificate checks stay on the name.
    """

    def __init__(self, *, deadline_s: float | None = None) -> None:
        self._sockets = httpcore.SyncBackend()
        self._deadline_s = deadline_s

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        failure: Exception | None = None
        ends = None if self._deadline_s is None else time.monotonic() + self._deadline_s
        for address in connect_addresses(host, port):
            try:
                stream = self._sockets.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
                return stream if ends is None else DeadlineStream(stream, ends=ends)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:
                failure = error  # the next checked address, as create_connection does
        assert failure is not None
        raise failure

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        raise OutboundRefused("the gateway connects to no local socket", path=path)

    def sleep(self, seconds: float) -> None:
        self._sockets.sleep(seconds)


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every wait ends by one instant (``ends``, monotonic).

    httpx's read timeout bounds each wait for bytes, not the answer: a remote that
    sends a byte a second within a 2 s read timeout holds the caller for as long as
    it likes (a slow drip). Each read, write and TLS handshake here waits at most
    what is left before ``ends``, and none starts after it (``httpcore.ReadTimeout``,
    which httpx raises as its own ``ReadTimeout``).
    """

    def __init__(self, stream: httpcore.NetworkStream, *, ends: float) -> None:
        self._stream = stream
        self._ends = ends

    def _left(self, timeout: float | None, error: type[Exception]) -> float:
        left = self._ends - time.monotonic()
        if left <= 0:
            raise error("the answer's deadline passed")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(
            ssl_context, server_hostname, self._left(timeout, httpcore.ConnectTimeout)
        )
        return DeadlineStream(stream, ends=self._ends)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class PolicyTransport(httpx.HTTPTransport):
    """httpx's transport with the policy on every request and every connection.

    The request's scheme, host and port are checked first (``origin_problem``);
    its connections go through ``PinnedBackend``. No proxy: a proxy would resolve
    the name itself, after the check. With ``deadline_s``, each connection's waits
    all end within that many seconds of its connect (``DeadlineStream``).
    """

    def __init__(self, *, deadline_s: float | None = None) -> None:
        # httpx's own __init__ only builds this pool, with no way to pass a network
        # backend (httpcore's extension point): the same pool, with the pinning one.
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context(),
            network_backend=PinnedBackend(deadline_s=deadline_s),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        problem = origin_problem(scheme=url.scheme, host=url.host, port=url.port)
        if problem:
            raise OutboundRefused(problem, host=url.host, port=url.port)
        return super().handle_request(request)


def ssl_context() -> ssl.SSLContext:
    """The verifying SSL context of the gateway's connections, shared in the process.

    Certificates as httpx verifies them: ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` as the
    environment names them now, else certifi's bundle. Loading a bundle costs about
    20 ms (docs/performance.md, issue 20), once per transport before; now once per
    process and setting. A context holds no per-connection state (SNI and the
    certificate check are per connection, on the URL's host), so sharing it weakens
    no check; a bundle file changed in place is read on the next process start.
    """
    return _ssl_context_for(
        os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None
    )


@functools.cache
def _ssl_context_for(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    # httpx.create_ssl_context reads the same two variables, in this order.
    return httpx.create_ssl_context()


def transport(*, deadline_s: float | None = None) -> httpx.BaseTransport:
    """A transport that calls only what the outbound URL policy allows; with
    ``deadline_s``, a connection's waits all end that many seconds after it began."""
    return PolicyTransport(deadline_s=deadline_s)
