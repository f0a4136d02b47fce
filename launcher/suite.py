"""``manage.py test [pytest args]``: the whole suite under pytest, database included.

The work of the ``test`` command, which replaces Django's own. With DATABASE_URL
unset, an embedded PostgreSQL runs for the duration of the run (data in
``var/pgdata-test``, port PORTAL_EMBEDDED_PG_PORT + 1, so it never meets the server
of ``manage.py up``); otherwise the tests use DATABASE_URL.

The run has two phases (``plan``): every test not marked ``slow`` in
``PORTAL_TEST_WORKERS`` pytest-xdist workers (2 by default, whole files to a
worker), each with its own test database (``<name>_gw0``, ``<name>_gw1``…), ticket
desk, browser and servers; then the ``slow`` tests (the fault tier: it restarts the
shared PostgreSQL and kills processes) in one process, alone. ``-m``, ``-k``, paths
and ``-x`` apply to both phases. ``--serial`` (or ``PORTAL_TEST_SERIAL=1``) runs
everything in one process, as before; an explicit ``-n`` or ``-p no:xdist`` is the
caller's and gives one pytest run as written. The exit code is pytest's: the first
phase's failure, else the second's; "no tests collected" (5) only when neither
phase ran any.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from django.conf import settings

from . import embedded_db

SERIAL_OPTION = "--serial"
SERIAL_ENV = "PORTAL_TEST_SERIAL"
WORKERS_ENV = "PORTAL_TEST_WORKERS"
# Set when the suite runs on a server it started itself, without fsync.
THROWAWAY_SERVER_ENV = "PORTAL_TEST_THROWAWAY_SERVER"
DEFAULT_WORKERS = 2
SLOW = "slow"
NO_TESTS_COLLECTED = 5


def plan(args: Sequence[str], env: Mapping[str, str]) -> list[list[str]]:
    """The pytest runs, in order, that ``manage.py test args`` makes."""
    args = list(args)
    serial = SERIAL_OPTION in args or env.get(SERIAL_ENV, "") not in ("", "0")
    args = [arg for arg in args if arg != SERIAL_OPTION]
    workers = int(env.get(WORKERS_ENV) or DEFAULT_WORKERS)
    if serial or workers < 2 or _drives_xdist(args):
        return [args]
    rest, marker = _split_marker(args)

    def selecting(expression: str) -> list[str]:
        return ["-m", f"({marker}) and {expression}" if marker else expression]

    phases = [
        [*rest, *selecting(f"not {SLOW}"), "-n", str(workers), "--dist", "loadfile"],
        [*rest, *selecting(SLOW)],
    ]
    # A phase no test can match (``-m "not slow"``'s second) is not run: collecting
    # the whole suite to find nothing takes a minute on a busy machine.
    return [phase for phase in phases if _may_match(phase[phase.index("-m") + 1])]


def _may_match(expression: str) -> bool:
    """False only if no set of markers satisfies the ``-m`` expression (names, and,
    or, not, parentheses; anything else is taken to match)."""
    tokens = re.findall(r"\(|\)|[^\s()]+", expression)
    keywords = {"and", "or", "not", "(", ")"}
    names = sorted({token for token in tokens if token not in keywords})
    if not all(re.fullmatch(r"[A-Za-z_][\w-]*", name) for name in names):
        return True
    if len(names) > 8:
        return True
    python = " ".join(
        token if token in keywords else f"marks[{names.index(token)}]"
        for token in tokens
    )
    for marks in itertools.product((False, True), repeat=len(names)):
        try:
            if eval(python, {"__builtins__": {}}, {"marks": marks}):  # noqa: S307 (names, and, or, not only)
                return True
        except SyntaxError:
            return True
    return False


def _drives_xdist(args: Sequence[str]) -> bool:
    """Whether the caller set xdist up (or turned it off) themselves."""
    for index, arg in enumerate(args):
        if arg in ("-n", "--numprocesses", "--dist", "-pno:xdist"):
            return True
        if arg.startswith(("--numprocesses=", "--dist=")):
            return True
        if arg.startswith("-n") and not arg.startswith("--"):  # -n4, -nauto
            return True
        if arg == "-p" and list(args[index + 1 : index + 2]) == ["no:xdist"]:
            return True
    return False


def _split_marker(args: Sequence[str]) -> tuple[list[str], str]:
    """``args`` without their ``-m`` options, and the last one's expression."""
    rest: list[str] = []
    marker = ""
    items = iter(args)
    for arg in items:
        if arg == "-m":
            marker = next(items, "")
        elif arg.startswith("-m") and not arg.startswith("--"):
            marker = arg[2:]
        else:
            rest.append(arg)
    return rest, marker


def _goes_on_after(code: int, args: Sequence[str]) -> bool:
    """Whether the next phase runs after one that exited with ``code``: not after
    an interruption or a usage error, nor after failures under ``-x``."""
    if code in (0, NO_TESTS_COLLECTED):
        return True
    stops_at_first = any(
        arg in ("-x", "--exitfirst") or arg.startswith("--maxfail") for arg in args
    )
    return code == 1 and not stops_at_first


def combined_exit_code(codes: Sequence[int]) -> int:
    """One exit code for the phases: the first failure; 5 only if all found none."""
    ran = [code for code in codes if code != NO_TESTS_COLLECTED]
    if not ran:
        return NO_TESTS_COLLECTED
    return next((code for code in ran if code != 0), 0)


def run_pytest(args: Sequence[str]) -> int:
    """Run pytest with ``args`` in child processes (``plan``); return its exit code."""
    env = dict(os.environ)
    with ExitStack() as stack:
        if not env.get("DATABASE_URL"):
            port = embedded_db.settings_port() + 1
            data_dir = Path(settings.VAR_DIR) / "pgdata-test"
            print(
                f"test: starting embedded PostgreSQL on {embedded_db.HOST}:{port} "
                f"(data in {data_dir})…",
                file=sys.stderr,
                flush=True,
            )
            env["DATABASE_URL"] = stack.enter_context(
                # Throwaway data: crash safety is not worth the fsync time.
                embedded_db.embedded_postgres(port, data_dir=data_dir, durable=False)
            )
            # Said to the tests that read durability off the live server
            # (tests/worker/test_durability_settings.py): this one is not the
            # product's.
            env[THROWAWAY_SERVER_ENV] = "1"
        codes: list[int] = []
        for phase in plan(args, env):
            if codes and not _goes_on_after(codes[-1], phase):
                break
            print(f"test: pytest {shlex.join(phase)}", file=sys.stderr, flush=True)
            codes.append(
                _run_in_foreground([sys.executable, "-m", "pytest", *phase], env=env)
            )
        return combined_exit_code(codes)


def _run_in_foreground(command: list[str], *, env: dict[str, str]) -> int:
    child = subprocess.Popen(  # noqa: S603 (our interpreter, the user's pytest args)
        command,
        cwd=settings.BASE_DIR,
        env=env,
        preexec_fn=embedded_db.die_with_parent(signal.SIGTERM),
    )

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    def let_child_handle(signum: int, frame: FrameType | None) -> None:
        # pytest shares the terminal's process group, so Ctrl-C reached it too; it
        # reports and cleans up, then this process stops the database.
        pass

    previous_int = signal.signal(signal.SIGINT, let_child_handle)
    previous_term = signal.signal(signal.SIGTERM, forward)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    # A child killed by a signal reports -signum; shells say 128 + signum.
    return code if code >= 0 else 128 - code
