"""Errors of the MCP server (docs/style.md R12: each app's in its exceptions.py)."""

from __future__ import annotations

from tasks.exceptions import TaskNotFound


class UnknownResource(Exception):
    """Not a resource URI this server knows."""


class DeskItemNotFound(TaskNotFound):
    """No such desk item."""


class BadArgument(Exception):
    """A tool call's arguments do not fit the tool: ``argument`` names which."""

    def __init__(self, argument: str, problem: str) -> None:
        self.argument = argument
        super().__init__(f"{argument}: {problem}")
