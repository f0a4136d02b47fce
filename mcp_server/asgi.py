"""The streamable-HTTP app as an import string, for uvicorn's worker processes.

``manage.py mcp --http`` binds the socket and sets ``PORTAL_MCP_URL`` and
``PORTAL_PUBLIC_URL`` before it starts its processes; each process (spawned, so
a fresh interpreter) sets Django up and builds the app here.
"""

from __future__ import annotations

import os

from starlette.applications import Starlette


def application() -> Starlette:
    """The app (uvicorn ``factory=True``): Django set up, then ``server.http_app``."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from mcp_server import server
    from portal import telemetry

    # As manage.py does for its own process (this one is a fresh interpreter);
    # ``up`` and the unit name the service with OTEL_SERVICE_NAME (portal-mcp).
    telemetry.setup("portal-mcp")

    return server.http_app(
        public_url=os.environ["PORTAL_MCP_URL"],
        issuer_url=os.environ["PORTAL_PUBLIC_URL"],
    )
