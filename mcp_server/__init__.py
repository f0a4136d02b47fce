"""The governed MCP server (docs/mcp.md): agents' grants as MCP tools, over
streamable HTTP (``manage.py mcp --http``) and stdio (``manage.py mcp --stdio``).

Wiring above the apps (docs/style.md R1): it imports the portal, tasks and audit
services and selectors; nothing imports it.
"""
