"""deploy/'s systemd units and environment file, read as the tests run them.

The units name the install layout (``/opt/portal`` with its ``.venv``, state in
``/var/lib/portal``); ``command`` maps those paths to this checkout, its virtualenv
and a folder of the test, and nothing else: the rest of each ``ExecStart`` runs as
written.
"""

from __future__ import annotations

import configparser
import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNITS = ("portal-web", "portal-worker", "portal-beat")
INSTALL = "/opt/portal"
STATE = "/var/lib/portal"
_VAR = re.compile(r"^(#?)([A-Z][A-Z0-9_]*)=(.*)$")


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(DEPLOY / f"{name}.service")
    return parser


def localise(text: str, *, state_dir: Path) -> str:
    """The unit's paths on this machine: the venv's binaries, the checkout, ``state_dir``."""
    venv_bin = str(Path(sys.executable).parent)
    return (
        text.replace(f"{INSTALL}/.venv/bin", venv_bin)
        .replace(INSTALL, str(REPO))
        .replace(STATE, str(state_dir))
    )


def command(name: str, *, state_dir: Path) -> list[str]:
    """The unit's ``ExecStart`` as argv, paths localised, ``%%`` unescaped."""
    line = unit(name)["Service"]["ExecStart"]
    assert "%" not in line.replace("%%", ""), f"unsupported specifier in {line}"
    return shlex.split(localise(line, state_dir=state_dir).replace("%%", "%"))


def credentials(name: str) -> dict[str, str]:
    """The unit's ``LoadCredential=ID:PATH`` lines: credential id to source path."""
    lines = unit(name)["Service"].get("LoadCredential", "").splitlines()
    return dict(line.split(":", 1) for line in lines if line.strip())


def environment(name: str, *, credentials_dir: Path) -> dict[str, str]:
    """The unit's own ``Environment=`` assignments, ``%d`` (its credentials
    directory) as ``credentials_dir``: what systemd adds to the EnvironmentFile."""
    assigned: dict[str, str] = {}
    for line in unit(name)["Service"].get("Environment", "").splitlines():
        for item in shlex.split(line):
            key, _, value = item.partition("=")
            assigned[key] = value.replace("%d", str(credentials_dir))
    return assigned


def environment_template() -> tuple[dict[str, str], dict[str, str]]:
    """deploy/portal.env.example: (active variables, commented-out defaults)."""
    active: dict[str, str] = {}
    optional: dict[str, str] = {}
    for line in (DEPLOY / "portal.env.example").read_text().splitlines():
        if match := _VAR.match(line):
            (optional if match[1] else active)[match[2]] = match[3]
    return active, optional


def settings_variables() -> set[str]:
    """Every environment variable config/settings.py and gunicorn.conf.py read."""
    names: set[str] = set()
    for path in (REPO / "config" / "settings.py", REPO / "gunicorn.conf.py"):
        text = path.read_text()
        names |= set(re.findall(r"os\.environ(?:\.get)?\(\s*\"([A-Z0-9_]+)\"", text))
        names |= set(re.findall(r"os\.environ\[\"([A-Z0-9_]+)\"\]", text))
        names |= set(re.findall(r"_env_(?:bool|list|count)\(\s*\"([A-Z0-9_]+)\"", text))
        names |= set(re.findall(r"\"([A-Z0-9_]+)\" (?:not )?in os\.environ", text))
    return names
