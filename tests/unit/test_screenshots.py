"""The README's and docs' pictures are what the browser tests last saw.

Every picture a page shows (``screenshots/NAME.png`` in README.md or docs/*.md) is
in ``docs/screenshots/`` and named in a browser test that writes it there through
``tests/browser/shots.py``'s ``docs_shot``; every file there is shown by some page
(no stale copies); and no browser test saves a screenshot by itself (a
``.screenshot(path=…)`` call outside the helper), so none is copied by hand.
Reads the sources with ``ast``, as ``test_layering.py`` does.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
SHOTS: Final = ROOT / "docs" / "screenshots"
BROWSER: Final = ROOT / "tests" / "browser"
HELPER: Final = "shots.py"
SHOWN: Final = re.compile(r"screenshots/([\w.-]+\.png)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shown() -> dict[str, list[str]]:
    """Picture name to the pages that show it."""
    found: dict[str, list[str]] = {}
    for page in _pages():
        for name in SHOWN.findall(page.read_text()):
            found.setdefault(name, []).append(str(page.relative_to(ROOT)))
    return found


def written_by_docs_shot(modules: dict[str, ast.Module]) -> set[str]:
    """``.png`` names in the string literals of modules that import ``docs_shot``
    (a name may pass through a local function, as test_policy_four_eyes's
    ``shoot``)."""
    names: set[str] = set()
    for module in modules.values():
        imports = any(
            isinstance(node, ast.ImportFrom)
            and any(alias.name == "docs_shot" for alias in node.names)
            for node in ast.walk(module)
        )
        if not imports:
            continue
        names |= {
            node.value
            for node in ast.walk(module)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.endswith(".png")
            and "/" not in node.value  # a name in its folder, as docs_shot takes
        }
    return names


def saved_by_hand(modules: dict[str, ast.Module]) -> list[str]:
    """``file:line`` of each ``X.screenshot(path=…)`` outside the helper."""
    return [
        f"{name}:{node.lineno}"
        for name, module in modules.items()
        if name != HELPER
        for node in ast.walk(module)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "screenshot"
        and any(keyword.arg == "path" for keyword in node.keywords)
    ]


def _browser_modules() -> dict[str, ast.Module]:
    return {
        path.name: ast.parse(path.read_text(), filename=str(path))
        for path in sorted(BROWSER.glob("*.py"))
    }


def test_every_picture_shown_is_written_there_by_a_browser_test() -> None:
    pictures = shown()
    assert len(pictures) > 10  # the walk found the docs
    missing = {name for name in pictures if not (SHOTS / name).is_file()}
    assert not missing, f"shown but not in docs/screenshots/: {sorted(missing)}"
    unwritten = set(pictures) - written_by_docs_shot(_browser_modules())
    assert not unwritten, (
        "no browser test writes these with docs_shot (tests/browser/shots.py): "
        f"{ {name: pictures[name] for name in sorted(unwritten)} }"
    )


def test_every_file_in_docs_screenshots_is_shown_by_a_page() -> None:
    files = {path.name for path in SHOTS.iterdir()}
    assert not files - set(shown()), "not shown by any page: " + ", ".join(
        sorted(files - set(shown()))
    )


def test_no_browser_test_saves_a_screenshot_by_itself() -> None:
    assert saved_by_hand(_browser_modules()) == []


def test_the_checks_catch_a_hand_saved_picture_and_an_unwritten_one() -> None:
    modules = {
        "test_a.py": ast.parse(
            "from tests.browser.shots import docs_shot\n"
            "docs_shot(page, 'a.png')\n"
            "page.screenshot(path='docs/screenshots/b.png')\n"
        ),
        "test_c.py": ast.parse("report_shot(page, 'c.png')\n"),
        HELPER: ast.parse("target.screenshot(path=str(path))\n"),
    }
    assert saved_by_hand(modules) == ["test_a.py:3"]
    assert written_by_docs_shot(modules) == {"a.png"}
