"""``manage.py test``: the parallel phase, then the ``slow`` tests alone (launcher/suite.py).

``plan`` is checked on argument lists; the end-to-end test runs the real command on
a small suite of its own (its own ini, so none of the portal's tests run) and reads
which process ran each test, and when.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.suite import combined_exit_code, plan

REPO = Path(__file__).resolve().parents[2]
PARALLEL = ["-n", "2", "--dist", "loadfile"]


def test_the_default_is_the_workers_then_the_slow_tests_alone():
    assert plan(["--durations=30"], {}) == [
        ["--durations=30", "-m", "not slow", *PARALLEL],
        ["--durations=30", "-m", "slow"],
    ]


def test_selections_apply_to_both_phases():
    args = ["tests/db", "-k", "lease", "-x", "-m", "browser or slow"]
    assert plan(args, {}) == [
        ["tests/db", "-k", "lease", "-x", "-m", "(browser or slow) and not slow",
         *PARALLEL],
        ["tests/db", "-k", "lease", "-x", "-m", "(browser or slow) and slow"],
    ]  # fmt: skip
    assert plan(["-mbrowser"], {})[1] == ["-m", "(browser) and slow"]


def test_a_phase_no_test_can_match_is_left_out():
    assert plan(["-m", "not slow"], {}) == [
        ["-m", "(not slow) and not slow", *PARALLEL]
    ]
    assert plan(["-m", "slow and not (a or b)"], {}) == [
        ["-m", "(slow and not (a or b)) and slow"]
    ]


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--serial", "tests/db"], {}),
        (["tests/db"], {"PORTAL_TEST_SERIAL": "1"}),
        (["tests/db"], {"PORTAL_TEST_WORKERS": "1"}),
    ],
)
def test_serial_is_one_run_as_given(args, env):
    assert plan(args, env) == [["tests/db"]]


@pytest.mark.parametrize(
    "args", [["-n", "4"], ["-nauto"], ["--numprocesses=3"], ["-p", "no:xdist"]]
)
def test_the_callers_own_xdist_options_are_one_run_as_given(args):
    assert plan(args, {}) == [args]


def test_more_workers_by_the_environment():
    assert plan([], {"PORTAL_TEST_WORKERS": "3"})[0][-3] == "3"


@pytest.mark.parametrize(
    ("codes", "combined"),
    [([0, 0], 0), ([0, 5], 0), ([5, 0], 0), ([5, 5], 5), ([1, 0], 1), ([0, 1], 1),
     ([5, 1], 1), ([2], 2)],
)  # fmt: skip
def test_one_exit_code_for_the_phases(codes, combined):
    assert combined_exit_code(codes) == combined


PROBE = """
import os, time
from pathlib import Path
import pytest

def record(name):
    with (Path(__file__).parent / "ran.txt").open("a") as out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        out.write(f"{name} {worker} {time.time()}\\n")
"""


def run_suite(tmp_path: Path, *args: str, **env: str) -> dict[str, tuple[str, float]]:
    """``manage.py test`` on the probe suite in ``tmp_path``: test -> (process, time)."""
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    slow: the serial phase\naddopts = --strict-markers\n"
    )
    (tmp_path / "test_one.py").write_text(
        PROBE
        + textwrap.dedent("""
            def test_one():
                record("one")

            @pytest.mark.slow
            def test_slow():
                record("slow")
        """)
    )
    (tmp_path / "test_two.py").write_text(
        PROBE + "\ndef test_two():\n    record('two')\n"
    )
    ran = tmp_path / "ran.txt"
    ran.unlink(missing_ok=True)
    command = [sys.executable, "manage.py", "test", "-c", str(tmp_path / "pytest.ini"),
               "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-p", "no:django",
               "-q", *args,
               str(tmp_path)]  # fmt: skip
    # Not this test's own worker's variables (it may run in one itself).
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        command, cwd=REPO, env={**inherited, **env}, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    records = {}
    for line in ran.read_text().splitlines():
        name, process, at = line.split()
        records[name] = (process, float(at))
    return records


def test_the_command_runs_workers_then_the_slow_tests_after_them(tmp_path):
    records = run_suite(tmp_path)
    assert set(records) == {"one", "two", "slow"}
    assert records["one"][0].startswith("gw")
    assert records["two"][0].startswith("gw")
    assert records["slow"][0] == "main"
    assert records["slow"][1] > max(records["one"][1], records["two"][1])


def test_serial_runs_everything_in_one_process(tmp_path):
    records = run_suite(tmp_path, "-m", "not slow", PORTAL_TEST_SERIAL="1")
    assert set(records) == {"one", "two"}
    assert {process for process, _ in records.values()} == {"main"}
