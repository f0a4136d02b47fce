"""Settings fail closed (issue 10 §2): no secret key and no explicit development mode
means no portal, rather than one on the public development key.

Each case starts a fresh interpreter, since settings load once per process.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.support.fresh_python import run_fresh_python

# Loads the settings the way every process does (web server, worker, command).
LOAD = "import django; django.setup(); from django.conf import settings; print(settings.PRODUCTION)"


def _run(args: list[str], **overrides: str) -> subprocess.CompletedProcess[str]:
    return run_fresh_python(
        args, drop=("DJANGO_SECRET_KEY", "PORTAL_DEV_MODE", "DJANGO_DEBUG"), **overrides
    )


def test_without_a_secret_key_or_development_mode_nothing_starts():
    loaded = _run(["-c", LOAD])
    assert loaded.returncode != 0
    assert "ImproperlyConfigured" in loaded.stderr
    # the message names both ways out
    assert "DJANGO_SECRET_KEY" in loaded.stderr
    assert "PORTAL_DEV_MODE=1" in loaded.stderr


def test_seed_demo_is_refused_without_development_mode():
    # A database that does not exist: were the refusal missing, nothing is seeded.
    seeded = _run(
        ["manage.py", "seed_demo"],
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/no_such_database_seed_test",
    )
    assert seeded.returncode != 0
    assert "PORTAL_DEV_MODE=1" in seeded.stderr
    assert "no_such_database" not in seeded.stderr  # refused before any connection


@pytest.mark.parametrize(
    ("overrides", "production"),
    [
        ({"PORTAL_DEV_MODE": "1"}, "False"),
        (
            {
                # Production refuses a short or placeholder secret, and wants the
                # redaction secret too (portal/production_secrets.py).
                "DJANGO_SECRET_KEY": "q7Vx2LmR9tK4wZ8pN3bH6yD1fJ5sC0gA-real-key-for-this-test",
                "PORTAL_REDACTION_SECRET": "Hn4Kw8Zr2Tq6Vb1Xm9Lp3Fd7Sg5Jc0Ya",
            },
            "True",
        ),
    ],
    ids=["development-mode", "secret-key"],
)
def test_either_way_out_starts(overrides: dict[str, str], production: str):
    loaded = _run(["-c", LOAD], **overrides)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip().splitlines()[-1] == production


@pytest.mark.parametrize("command", ["up", "test"])
def test_manage_py_up_and_test_choose_development_mode_themselves(command: str):
    helped = _run(["manage.py", command, "--help"])
    assert helped.returncode == 0, helped.stderr
