"""Every error of the portal's hierarchy lives in its app's ``exceptions.py`` (R12).

Read with ``ast``: a class whose base is ``PortalError`` or one of its subclasses
(by name, followed through every app) must be defined in a module named
``exceptions.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_layering import ROOT, floor_modules


def portal_errors_outside_exceptions(root: Path) -> list[str]:
    """``path:Class`` for each subclass of PortalError not in an exceptions.py."""
    classes: list[tuple[Path, ast.ClassDef]] = [
        (path, node)
        for path in floor_modules(root)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]
    errors = {"PortalError"}
    while True:  # follow subclasses of subclasses, whatever the file order
        found = {
            node.name
            for _, node in classes
            if any(ast.unparse(base).split(".")[-1] in errors for base in node.bases)
        }
        if found <= errors:
            break
        errors |= found
    return sorted(
        f"{path.relative_to(root).as_posix()}:{node.name}"
        for path, node in classes
        if path.name != "exceptions.py"
        and any(ast.unparse(base).split(".")[-1] in errors for base in node.bases)
    )


def test_the_check_finds_an_error_defined_elsewhere(tmp_path: Path) -> None:
    """A subclass of a subclass outside exceptions.py is reported; inside it is not."""
    # given an error in tasks/exceptions.py and one built on it in tasks/takeover.py
    (tmp_path / "portal").mkdir()
    (tmp_path / "portal" / "exceptions.py").write_text(
        "class PortalError(Exception): ...\nclass NotFound(PortalError): ...\n"
    )
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "exceptions.py").write_text(
        "from portal import exceptions\nclass TaskGone(exceptions.NotFound): ...\n"
    )
    (tmp_path / "tasks" / "takeover.py").write_text(
        "from .exceptions import TaskGone\nclass Claimed(TaskGone): ...\n"
        "class Plain(ValueError): ...\n"
    )
    # then only the one outside exceptions.py is reported
    assert portal_errors_outside_exceptions(tmp_path) == ["tasks/takeover.py:Claimed"]


def test_every_portal_error_is_in_an_exceptions_module() -> None:
    """No PortalError subclass is defined outside an app's exceptions.py."""
    assert portal_errors_outside_exceptions(ROOT) == []
