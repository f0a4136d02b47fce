"""``python -m ticketdesk --port PORT [--host 127.0.0.1] --keys JWKS_FILE
[--tls-cert FILE --tls-key FILE]``.

Prints ``ticketdesk listening on http://HOST:PORT`` (``https://`` with TLS) once it
accepts connections, then serves until SIGTERM or SIGINT (or, with
``--exit-on-stdin-eof``, until its standard input closes). POSIX only.
"""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from .server import (
    DEFAULT_AUDIENCE,
    TicketDeskServer,
    in_network_namespace,
    is_loopback,
)

KEYS_ENV: Final = "TICKETDESK_KEYS"
_STOP_SIGNALS: Final = {signal.SIGTERM, signal.SIGINT}


_OTLP_ENDPOINTS: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ticketdesk",
        description="Run the ticket desk, a remote business system for tests.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, required=True, help="the port; 0 picks a free one"
    )
    parser.add_argument(
        "--netns",
        default=None,
        help="the network namespace (ip netns) this desk runs in: then --host may be "
        "that namespace's address, not only loopback (tests/support/netns.py)",
    )
    parser.add_argument(
        "--keys",
        default=os.environ.get(KEYS_ENV),
        help="a JWKS file of the Ed25519 public keys credentials are verified with, "
        f"read again when it changes (default: ${KEYS_ENV})",
    )
    parser.add_argument(
        "--audience",
        default=DEFAULT_AUDIENCE,
        help="this desk's target name: the aud a credential must carry "
        f"(default {DEFAULT_AUDIENCE})",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        help="serve https with this PEM certificate chain (the server's first)",
    )
    parser.add_argument(
        "--tls-key", type=Path, help="the PEM private key of --tls-cert"
    )
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="stop when standard input closes (the launcher has gone)",
    )
    return parser


def _tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server-side context holding ``cert`` and ``key`` (TLS 1.2 or later).

    Raises:
        OSError: a file cannot be read, or (``ssl.SSLError``) is no certificate or
            key, or the key does not match.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=cert, keyfile=key)
    return context


def _stop_on_stdin_eof() -> None:
    # The launcher holds the pipe's other end; it closes when the launcher dies,
    # however it dies, and the desk then stops like on SIGTERM.
    # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader's
    # lock makes interpreter shutdown abort.
    while os.read(sys.stdin.fileno(), 4096):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def _export_spans() -> None:
    """Export the desk's request spans over OTLP/HTTP when an endpoint is set
    (``OTEL_EXPORTER_OTLP_ENDPOINT``, as the portal); the SDK flushes them at exit."""
    if not any(os.environ.get(name) for name in _OTLP_ENDPOINTS):
        return
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = os.environ.get("OTEL_SERVICE_NAME")
    resource = Resource.create({} if named else {SERVICE_NAME: "ticketdesk"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until told to stop; return the exit status."""
    args = _parser().parse_args(argv)
    _export_spans()
    if not args.keys:
        _parser().error(f"give --keys or set ${KEYS_ENV}")
    if args.netns is not None and not in_network_namespace(args.netns):
        _parser().error(f"--netns {args.netns!r}: not the namespace this runs in")
    if not is_loopback(args.host) and args.netns is None:
        _parser().error(
            f"--host must be a loopback address, not {args.host!r} (any address"
            " only with --netns, inside that network namespace)"
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        _parser().error("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert is not None:
        try:
            tls = _tls_context(args.tls_cert, args.tls_key)
        except OSError as error:
            print(
                f"ticketdesk: cannot load the TLS certificate: {error}", file=sys.stderr
            )
            return 2
    # Blocked before any thread starts, so every thread inherits the mask and the
    # signals wait for sigwait below: no handler runs in the middle of a lock.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        server = TicketDeskServer(
            args.host,
            args.port,
            keys_path=Path(args.keys),
            audience=args.audience,
            tls=tls,
            netns=args.netns,
        )
    except ValueError as error:
        print(f"ticketdesk: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(
            f"ticketdesk: cannot listen on {args.host}:{args.port}: {error}",
            file=sys.stderr,
        )
        return 1
    serving = threading.Thread(
        target=server.serve_forever,
        # shutdown() waits for the loop to notice; the default 0.5 s slows every stop.
        kwargs={"poll_interval": 0.05},
        name="serve",
        daemon=True,
    )
    serving.start()
    if args.exit_on_stdin_eof:
        threading.Thread(target=_stop_on_stdin_eof, name="stdin", daemon=True).start()
    # The socket listens already (bound in the constructor): launchers wait for this.
    print(f"ticketdesk listening on {server.url}", flush=True)
    received = signal.sigwait(_STOP_SIGNALS)
    print(f"ticketdesk: {signal.Signals(received).name}, stopping", file=sys.stderr)
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
