from __future__ import annotations

from django.apps import AppConfig


class McpServerConfig(AppConfig):
    """An app only for its management command, ``manage.py mcp``."""

    name = "mcp_server"
    verbose_name = "MCP server"
