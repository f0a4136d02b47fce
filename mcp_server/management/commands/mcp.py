"""``manage.py mcp``: the governed MCP server (docs/mcp.md).

``--http`` serves streamable HTTP at ``http://127.0.0.1:<port>/mcp`` with uvicorn,
in ``--processes`` worker processes sharing the port (``manage.py up`` runs it so;
``deploy/portal-mcp.service`` in production).
``--stdio`` serves one local agent over stdin/stdout, as the agent whose key is in
``PORTAL_API_KEY``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Final

import anyio
import uvicorn
from django.core.management.base import BaseCommand, CommandError, CommandParser
from uvicorn.supervisors import Multiprocess

from mcp_server import auth, server

DEFAULT_PORT: Final = 8200
KEY_VARIABLE: Final = "PORTAL_API_KEY"


def mcp_port() -> int:
    """``PORTAL_MCP_PORT`` or 8200 (``up`` reads the same)."""
    return int(os.environ.get("PORTAL_MCP_PORT", DEFAULT_PORT))


def mcp_processes() -> int:
    """``PORTAL_MCP_PROCESSES``, else one per CPU up to four: the tool calls' Python
    work (Django, the gateway) holds one process's interpreter lock, so one process
    uses one core however many threads it has."""
    configured = os.environ.get("PORTAL_MCP_PROCESSES")
    if configured:
        return max(1, int(configured))
    return max(1, min(4, os.cpu_count() or 1))


class Command(BaseCommand):
    help = (
        "Serve the governed MCP server: --http (streamable HTTP at /mcp) or --stdio "
        f"(one local agent, key in ${KEY_VARIABLE})."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        door = parser.add_mutually_exclusive_group(required=True)
        door.add_argument("--http", action="store_true", help="streamable HTTP")
        door.add_argument("--stdio", action="store_true", help="stdin and stdout")
        parser.add_argument(
            "--host", default="127.0.0.1", help="address to listen on (HTTP)"
        )
        parser.add_argument(
            "--port",
            type=int,
            default=mcp_port(),
            help=f"port (HTTP; default PORTAL_MCP_PORT or {DEFAULT_PORT})",
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=None,
            help="worker processes (HTTP; default PORTAL_MCP_PROCESSES, else one "
            "per CPU up to four)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["stdio"]:
            self._stdio()
        else:
            processes = options["processes"] or mcp_processes()
            self._http(host=options["host"], port=options["port"], processes=processes)

    def _stdio(self) -> None:
        secret = os.environ.get(KEY_VARIABLE, "").strip()
        if not secret:
            raise CommandError(
                f"--stdio serves the agent whose key is in ${KEY_VARIABLE}"
            )
        try:
            server.check_key(secret)
        except auth.KeyRefused as refused:
            raise CommandError(f"{refused.code}: {refused}") from None
        anyio.run(lambda: server.serve_stdio(secret=secret))

    def _http(self, *, host: str, port: int, processes: int) -> None:
        public_url = os.environ.get("PORTAL_MCP_URL") or f"http://{host}:{port}/mcp"
        issuer_url = os.environ.get("PORTAL_PUBLIC_URL") or (
            f"http://127.0.0.1:{os.environ.get('PORTAL_PORT', '8000')}"
        )
        # The worker processes are spawned (fresh interpreters): they read the two
        # URLs from the environment (mcp_server.asgi).
        os.environ["PORTAL_MCP_URL"] = public_url
        os.environ["PORTAL_PUBLIC_URL"] = issuer_url
        config = uvicorn.Config(
            "mcp_server.asgi:application",
            factory=True,
            host=host,
            port=port,
            workers=processes,
            # The portal's level (manage.py up: WARNING unless PORTAL_LOG_LEVEL).
            log_level=os.environ.get("PORTAL_LOG_LEVEL", "INFO").lower(),
            access_log=False,
            # The source address is the socket's peer, as the REST API's
            # REMOTE_ADDR (behind a proxy, the proxy's): uvicorn would otherwise
            # take X-Forwarded-For from a client on 127.0.0.1, and a client there
            # could name a new address for each failed authentication.
            proxy_headers=False,
        )
        # Bound and listening before the announcement: a client that connects at
        # once waits in the backlog until a process accepts, never refused.
        sock = config.bind_socket()
        sock.listen(config.backlog)
        sys.stdout.write(f"mcp: {processes} worker processes\n")
        sys.stdout.write(f"mcp listening on {public_url}\n")
        sys.stdout.flush()
        if processes == 1:
            uvicorn.Server(config).run(sockets=[sock])
        else:
            Multiprocess(config, sockets=[sock]).run()
