"""The apps' imports point down only (docs/architecture.md, "Layering").

The floors, bottom first: ``portal`` (tenancy, identity, plumbing) → ``audit`` (the
record) → the rules (``policies``, ``limits``, ``routing``) → ``tasks`` (the domain)
→ what uses the domain (``console``, ``tenant_deletion``, ``mcp_server``) → the
wiring (``config``: settings, URLs, the Celery app, the commands that span apps; and
``launcher``, the processes ``up`` and ``test`` start). A module may import its own
floor and those below, never one above. Read from the source with ``ast``, so an
import inside a function or under ``TYPE_CHECKING`` counts as much as one at the top
of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Bottom first. ticketdesk (the stand-in remote system) imports no app either.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("portal", "ticketdesk"),
    ("audit",),
    ("policies", "limits", "routing"),
    ("tasks",),
    ("console", "tenant_deletion", "mcp_server"),
    ("config", "launcher"),
)
FLOOR_OF = {package: floor for floor, names in enumerate(FLOORS) for package in names}

# Known imports up a floor, each with its reason; anything else fails.
ALLOWED_UP: dict[str, set[str]] = {
    # routing's delivery and jobs are domain modules (tests/routing/test_layers.py).
    "routing/delivery.py": {"tasks"},
    "routing/jobs.py": {"tasks"},
    # Not yet moved: the verifier reads the tombstones of deleted tenants.
    "audit/management/commands/verify_audit.py": {"tenant_deletion"},
}


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


def imports_up(root: Path, path: Path) -> list[str]:
    """The modules ``path`` (a file under ``root``) imports from a higher floor."""
    relative = path.relative_to(root)
    floor = FLOOR_OF[relative.parts[0]]
    allowed = ALLOWED_UP.get(relative.as_posix(), set())
    return sorted(
        name
        for name in imported_modules(path)
        if FLOOR_OF.get(name.split(".")[0], -1) > floor
        and name.split(".")[0] not in allowed
    )


def floor_modules(root: Path) -> list[Path]:
    """Every Python file of every package on a floor, under ``root``."""
    return sorted(
        path for package in FLOOR_OF for path in (root / package).rglob("*.py")
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


def test_the_checker_refuses_an_import_up_a_floor(tmp_path: Path) -> None:
    """A lower floor importing a higher one is reported; down and sideways are not."""
    # given portal reaching the wiring, audit the domain, and tasks importing down
    for relative, source in {
        "portal/metrics_views.py": "def f():\n    from config.celery import app\n",
        "audit/relay.py": "from tasks import selectors\nfrom portal import db\n",
        "tasks/services.py": "import audit.services\nfrom routing import models\n",
        "config/urls.py": "from console import site\nimport launcher.up\n",
    }.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(source)
    found = {
        path.relative_to(tmp_path).as_posix(): imports_up(tmp_path, path)
        for path in floor_modules(tmp_path)
    }
    # then exactly the two imports up are reported
    assert found == {
        "audit/relay.py": ["tasks"],
        "config/urls.py": [],
        "portal/metrics_views.py": ["config.celery"],
        "tasks/services.py": [],
    }


@pytest.mark.parametrize(
    "path", floor_modules(ROOT), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_module_imports_a_higher_floor(path: Path) -> None:
    """Imports point down (or along a floor), never up (R1)."""
    assert imports_up(ROOT, path) == []


def test_the_allowed_exceptions_are_still_needed() -> None:
    """An exception whose import is gone is dropped from ALLOWED_UP, not kept."""
    for relative, packages in ALLOWED_UP.items():
        imported = {name.split(".")[0] for name in imported_modules(ROOT / relative)}
        assert packages <= imported, f"{relative} no longer imports {packages}"


def test_portal_is_the_ground_floor() -> None:
    """portal holds no wiring any more: settings, URLs and Celery live in config."""
    for name in ("settings", "urls", "wsgi", "celery", "metrics_views", "health"):
        assert not (ROOT / "portal" / f"{name}.py").exists(), f"portal/{name}.py"
        assert (ROOT / "config" / f"{name}.py").exists(), f"config/{name}.py"


def _absolute_imports(path: Path, root: Path = ROOT) -> set[str]:
    """``imported_modules`` with relative imports resolved against ``path``'s package
    (``path`` a file under ``root``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).with_suffix("").parts[:-1]
    names = imported_modules(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package[: len(package) - (node.level - 1)]
            module = ".".join((*base, node.module) if node.module else base)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "tasks" / "gateway").rglob("*.py")),
    ids=lambda p: p.name,
)
def test_the_gateway_never_imports_the_takeover_desk(path: Path) -> None:
    """One direction: the takeover desk uses the gateway (a person's edit runs
    through it); the gateway hands uncertainty to tasks/escalation.py, never to
    tasks/takeover.py."""
    assert not any(
        name == "tasks.takeover" or name.startswith("tasks.takeover.")
        for name in _absolute_imports(path)
    )


def test_the_relative_import_reader_resolves_parents(tmp_path: Path) -> None:
    """The check above would pass vacuously if ``from ..takeover import x`` were
    not read as tasks.takeover."""
    module = tmp_path / "tasks" / "gateway" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text("from ..takeover import task_human_edit\nfrom . import checks\n")
    names = _absolute_imports(module, root=tmp_path)
    assert "tasks.takeover" in names
    assert "tasks.gateway" in names
