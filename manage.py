#!/usr/bin/env python3
"""Django's command-line utility, which first puts itself inside the project's venv.

``python3 manage.py <command>`` works on a machine with nothing but Python 3.11+:
run from any interpreter other than ``.venv/bin/python``, it creates ``.venv`` when
missing, installs the dependencies (the portal and its agent client, portal_client/)
when pyproject.toml, constraints.txt or portal_client/pyproject.toml changed
since the last install, and re-executes itself with the venv's interpreter. The
bootstrap uses only the standard library, because nothing else is installed yet.
Set PORTAL_NO_BOOTSTRAP=1 to run in the current interpreter as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

MIN_PYTHON = (3, 11)
REPO = Path(__file__).resolve().parent
VENV = REPO / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
# What the installed dependencies were made from; a change means reinstall.
DEPENDENCY_FILES = ("pyproject.toml", "constraints.txt", "portal_client/pyproject.toml")
STAMP = VENV / ".portal-dependencies.sha256"


def _say(message: str) -> None:
    print(f"manage.py: {message}", file=sys.stderr, flush=True)


def _dependencies_hash() -> str:
    digest = hashlib.sha256()
    for name in DEPENDENCY_FILES:
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes() + b"\0")
    return digest.hexdigest()


def _venv_is_current(wanted: str) -> bool:
    # A venv whose interpreter was removed has a dangling bin/python symlink.
    return VENV_PYTHON.exists() and STAMP.exists() and STAMP.read_text() == wanted


def _run(command: list[str], failure: str) -> None:
    result = subprocess.run(command, cwd=REPO, check=False)  # noqa: S603 (fixed)
    if result.returncode != 0:
        _say(failure)
        sys.exit(result.returncode)


def _prepare_venv() -> None:
    wanted = _dependencies_hash()
    if _venv_is_current(wanted):
        return
    # Two first runs at once (`up` in one terminal, `test` in another) must not
    # build the venv together: hold an exclusive lock on the repository folder.
    lock = os.open(REPO, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _venv_is_current(wanted):  # the other run has just done it
            return
        if not VENV_PYTHON.exists():
            _say("creating virtualenv…")
            _run(
                [sys.executable, "-m", "venv", "--clear", str(VENV)],
                "could not create .venv. On Debian or Ubuntu, install the venv "
                "module first: apt-get install python3-venv",
            )
        _say("installing dependencies (first run takes a minute)…")
        _run(
            [
                str(VENV_PYTHON), "-m", "pip", "install", "--quiet",
                "--disable-pip-version-check", "--editable", ".[dev,local]",
                # The agent client (its own package) for the examples and tests.
                "--editable", "portal_client",
                "--constraint", "constraints.txt",
            ],
            "installing dependencies failed (pip's output is above)",
        )  # fmt: skip
        STAMP.write_text(wanted)
    finally:
        os.close(lock)


def _bootstrap() -> None:
    """Make sure ``.venv`` is ready, then replace this process with its python."""
    if sys.version_info < MIN_PYTHON:
        wanted = ".".join(map(str, MIN_PYTHON))
        sys.exit(
            f"manage.py needs Python {wanted} or newer; this is "
            f"{sys.version.split()[0]} ({sys.executable})."
        )
    if os.environ.get("PORTAL_NO_BOOTSTRAP") == "1":
        return
    if Path(sys.prefix).resolve() == VENV.resolve():
        os.environ.pop("_PORTAL_BOOTSTRAPPED", None)
        return
    if os.environ.get("_PORTAL_BOOTSTRAPPED"):
        # The venv's python did not report the venv as sys.prefix: stop, don't loop.
        sys.exit(f"manage.py: {VENV_PYTHON} does not run inside {VENV}; delete .venv")
    _prepare_venv()
    os.environ["_PORTAL_BOOTSTRAPPED"] = "1"
    os.execv(VENV_PYTHON, [str(VENV_PYTHON), *sys.argv])  # noqa: S606 (our venv)


# Commands that run the development setup: they choose development mode themselves,
# so the settings (which refuse to start without DJANGO_SECRET_KEY or an explicit
# PORTAL_DEV_MODE=1) let them run; their child processes inherit it.
DEV_COMMANDS = ("up", "test")


def main() -> None:
    _bootstrap()
    if len(sys.argv) > 1 and sys.argv[1] in DEV_COMMANDS:
        os.environ.setdefault("PORTAL_DEV_MODE", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    if len(sys.argv) > 1 and sys.argv[1] not in DEV_COMMANDS:
        # A command is a process of its own: its tracer provider (``up`` and
        # ``test`` only start other processes, which set up their own).
        import contextlib

        from django.core.exceptions import ImproperlyConfigured

        from portal import telemetry

        # On a refusal of the settings the command reports it itself.
        with contextlib.suppress(ImproperlyConfigured):
            telemetry.setup("portal-command")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
