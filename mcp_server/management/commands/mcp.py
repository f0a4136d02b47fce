"""``manage.py mcp``: the governed MCP server (docs/mcp.md).

``--http`` serves streamable HTTP at ``http://127.0.0.1:<port>/mcp`` with uvicorn
(``manage.py up`` runs it so; ``deploy/portal-mcp.service`` in production).
``--stdio`` serves one local agent over stdin/stdout, as the agent whose key is in
``PORTAL_API_KEY``.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, Final

import anyio
import uvicorn
from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcp_server import auth, server

DEFAULT_PORT: Final = 8200
KEY_VARIABLE: Final = "PORTAL_API_KEY"


def mcp_port() -> int:
    """``PORTAL_MCP_PORT`` or 8200 (``up`` reads the same)."""
    return int(os.environ.get("PORTAL_MCP_PORT", DEFAULT_PORT))


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

    def handle(self, *args: Any, **options: Any) -> None:
        if options["stdio"]:
            self._stdio()
        else:
            self._http(host=options["host"], port=options["port"])

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

    def _http(self, *, host: str, port: int) -> None:
        public_url = os.environ.get("PORTAL_MCP_URL") or f"http://{host}:{port}/mcp"
        issuer_url = os.environ.get("PORTAL_PUBLIC_URL") or (
            f"http://127.0.0.1:{os.environ.get('PORTAL_PORT', '8000')}"
        )
        app = server.http_app(public_url=public_url, issuer_url=issuer_url)
        config = uvicorn.Config(
            app, host=host, port=port, log_level="info", access_log=False
        )
        _Announcing(config, url=public_url).run()


class _Announcing(uvicorn.Server):
    """uvicorn, saying ``mcp listening on <url>`` once its socket listens (the line
    ``up`` and the tests wait for)."""

    def __init__(self, config: uvicorn.Config, *, url: str) -> None:
        super().__init__(config)
        self.url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            sys.stdout.write(f"mcp listening on {self.url}\n")
            sys.stdout.flush()
