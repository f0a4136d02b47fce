"""The apps' imports point down only (docs/style.md R1): tasks → audit → portal.

Read from the source with ``ast``, so an import inside a function or under
``TYPE_CHECKING`` counts as much as one at the top of a module. What spans every app
(the URL table, the management commands, the tenant purge, the launcher) sits above
the apps and is not checked here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# portal's base modules (R1): what every other app builds on.
PORTAL_BASE = (
    "models", "selectors", "services", "db", "codes", "actors", "ids", "tracing",
    "api", "exceptions", "idempotency", "metrics", "telemetry", "logs",
)  # fmt: skip


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name that ``path`` imports, wherever the import is."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def imports_of(path: Path, *packages: str) -> list[str]:
    """The modules ``path`` imports from any of ``packages``, sorted."""
    return sorted(
        name for name in imported_modules(path) if name.split(".")[0] in packages
    )


def test_the_checker_sees_every_form_of_import(tmp_path: Path) -> None:
    """Top-level, from-, dotted and function-level imports are all found."""
    # given a module that imports tasks in four ways and itself relatively
    module = tmp_path / "sample.py"
    module.write_text(
        "import tasks\n"
        "from tasks.models import Task\n"
        "import tasks.selectors as s\n"
        "from . import tasks as sibling\n"
        "def f():\n"
        "    from tasks import api\n"
    )
    # then every absolute import is reported, the relative one is not
    assert imports_of(module, "tasks") == ["tasks", "tasks.models", "tasks.selectors"]


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "audit").rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_audit_imports_nothing_from_tasks(path: Path) -> None:
    """audit knows no task: an event names its task by id (R1)."""
    assert imports_of(path, "tasks") == []


@pytest.mark.parametrize("name", PORTAL_BASE)
def test_portal_base_imports_neither_tasks_nor_audit(name: str) -> None:
    """portal's base modules are the bottom layer: they import no other app."""
    path = ROOT / "portal" / f"{name}.py"
    assert path.exists(), f"portal/{name}.py is gone: update PORTAL_BASE"
    assert imports_of(path, "tasks", "audit") == []
