"""Where the browser tests' screenshots go: the one helper every test uses.

- :func:`docs_shot` writes a picture the README or a docs/ page shows straight into
  ``docs/screenshots/``, so each such picture is what the last run of its test
  saw (no copying by hand from ``reports/``). Look at a changed picture before
  committing it.
- :func:`report_shot` writes any other picture into ``reports/`` (git-ignored), for
  a person reading a failed run.

``tests/unit/test_screenshots.py`` holds the tier to it: every picture the docs
show is in ``docs/screenshots/`` and named in a ``docs_shot`` call, every file
there is shown by some page, and no browser test saves a screenshot by itself.
A fresh clone's run rewrites the tracked pictures in place (the same names), and
nothing else in the tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = ROOT / "docs" / "screenshots"
REPORTS: Final = ROOT / "reports"


def _shot(folder: Path, target: Any, name: str, options: dict[str, Any]) -> Path:
    if "/" in name or not name.endswith(".png"):
        raise ValueError(f"a screenshot is NAME.png in its folder, not {name!r}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if options.get("full_page") and hasattr(target, "evaluate"):
        # A whole page is shot from its top: scrolled down, the admin's sticky
        # sidebar would be drawn where the scroll left it, halfway down the picture.
        target.evaluate("window.scrollTo(0, 0)")
    target.screenshot(path=str(path), **options)
    return path


def docs_shot(target: Any, name: str, **options: Any) -> Path:
    """Screenshot ``target`` (a Playwright page or locator) as
    ``docs/screenshots/NAME``; ``options`` go to Playwright (``full_page=True``)."""
    return _shot(DOCS, target, name, options)


def report_shot(target: Any, name: str, **options: Any) -> Path:
    """Screenshot ``target`` as ``reports/NAME`` (not tracked)."""
    return _shot(REPORTS, target, name, options)
