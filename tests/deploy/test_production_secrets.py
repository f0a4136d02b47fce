"""Production refuses to start on a placeholder, short or missing secret.

Each case starts a fresh interpreter with deploy/portal.env.example's variables
filled with good values, then one of them spoiled, and sets Django up as every
process does (``django.setup()``; the web server's as ``config/wsgi.py`` does).
Refused means a non-zero exit whose ``ImproperlyConfigured`` names the variable.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from portal.production_secrets import URLS_WITH_PASSWORDS
from tests.deploy import units

# As manage.py and the Celery app (config/celery.py) name the settings first.
SETUP = (
    "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); "
    "import django; django.setup()"
)
WEB = "import config.wsgi"
# Django's development default (config/settings.py), which contains "insecure".
DEVELOPMENT_KEY = "django-insecure-development-only-key-never-use-in-production"


def _key_files(tmp: Path) -> tuple[Path, Path]:
    private = Ed25519PrivateKey.generate()
    key_file = tmp / "audit-signing-key.pem"
    key_file.write_bytes(
        private.private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
    )
    public_file = tmp / "audit-public-key.pem"
    public_file.write_bytes(
        private.public_key().public_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PublicFormat.SubjectPublicKeyInfo,
        )
    )
    return key_file, public_file


def _good_environment(tmp: Path) -> dict[str, str]:
    """The environment file's active lines, every secret a good one."""
    active, _ = units.environment_template()
    _, public_file = _key_files(tmp)
    password = secrets.token_urlsafe(24)
    env = {
        **active,
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "PORTAL_REDACTION_SECRET": secrets.token_urlsafe(32),
        "PORTAL_AUDIT_PUBLIC_KEY_FILE": str(public_file),
        "DATABASE_URL": f"postgres://portal_app:{password}@127.0.0.1:5432/portal",
        "CELERY_BROKER_URL": f"amqp://portal:{password}@127.0.0.1:5672/portal",
        "DJANGO_STATIC_ROOT": str(tmp / "static"),
        "PORTAL_VAR_DIR": str(tmp / "state"),
    }
    assert not [k for k, v in env.items() if "change-me" in v], env
    env.update(PATH=os.environ["PATH"], HOME=str(tmp), LANG="C.UTF-8")
    return env


def _start(env: dict[str, str], code: str = SETUP) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=units.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _assert_refused(done: subprocess.CompletedProcess[str], variable: str) -> None:
    assert done.returncode != 0, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured"), last
    assert variable in last, last


@pytest.mark.parametrize("code", [SETUP, WEB], ids=["process", "web"])
def test_good_secrets_start(tmp_path: Path, code: str) -> None:
    done = _start(_good_environment(tmp_path), code)

    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DJANGO_SECRET_KEY", "change-me"),
        ("DJANGO_SECRET_KEY", DEVELOPMENT_KEY),
        # Random values get fixed ids: every process (xdist worker) collects alike.
        pytest.param(
            "DJANGO_SECRET_KEY", secrets.token_hex(24), id="DJANGO_SECRET_KEY-48-hex"
        ),
        ("DJANGO_SECRET_KEY", "ab" * 40),  # long, two different characters
        ("PORTAL_REDACTION_SECRET", None),
        ("PORTAL_REDACTION_SECRET", ""),
        ("PORTAL_REDACTION_SECRET", "change-me"),
        ("PORTAL_REDACTION_SECRET", "an-example-redaction-secret-for-the-docs"),
        pytest.param(
            "PORTAL_REDACTION_SECRET",
            secrets.token_hex(15),
            id="PORTAL_REDACTION_SECRET-30-hex",
        ),
        ("PORTAL_METRICS_TOKEN", "change-me"),
        pytest.param(
            "PORTAL_METRICS_TOKEN",
            secrets.token_hex(12),
            id="PORTAL_METRICS_TOKEN-24-hex",
        ),
        ("PORTAL_AUDIT_PUBLIC_KEY_FILE", "change-me"),
    ],
)
def test_a_bad_secret_is_refused(
    tmp_path: Path, variable: str, value: str | None
) -> None:
    env = _good_environment(tmp_path)
    if value is None:
        del env[variable]
    else:
        env[variable] = value

    _assert_refused(_start(env), variable)


@pytest.mark.parametrize(
    ("variable", "spoil"),
    [
        ("PORTAL_AUDIT_SIGNING_KEY", "placeholder"),
        ("PORTAL_AUDIT_SIGNING_KEY", "not-pem"),
        ("PORTAL_AUDIT_SIGNING_KEY_FILE", "placeholder"),
        ("PORTAL_AUDIT_SIGNING_KEY_FILE", "not-pem"),
        ("PORTAL_AUDIT_SIGNING_KEY_FILE", "missing-file"),
        ("PORTAL_AUDIT_PUBLIC_KEY_FILE", "not-pem"),
        ("PORTAL_AUDIT_PUBLIC_KEY_FILE", "missing-file"),
    ],
)
def test_an_audit_key_that_is_no_ed25519_pem_is_refused(
    tmp_path: Path, variable: str, spoil: str
) -> None:
    env = _good_environment(tmp_path)
    text = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
    if spoil == "placeholder":
        env[variable] = "change-me"
    elif spoil == "missing-file":
        env[variable] = str(tmp_path / "no-such-key.pem")
    elif variable.endswith("_FILE"):
        (tmp_path / "bad.pem").write_text(text)
        env[variable] = str(tmp_path / "bad.pem")
    else:
        env[variable] = text

    _assert_refused(_start(env), variable)


def test_a_real_signing_key_starts_a_worker(tmp_path: Path) -> None:
    env = _good_environment(tmp_path)
    # the pair of the public key file, as the worker's unit gives it
    env["PORTAL_AUDIT_SIGNING_KEY_FILE"] = str(tmp_path / "audit-signing-key.pem")

    done = _start(env)

    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("variable", sorted(URLS_WITH_PASSWORDS))
def test_a_placeholder_password_in_a_url_is_refused(
    tmp_path: Path, variable: str
) -> None:
    env = _good_environment(tmp_path)
    scheme = {"DATABASE_URL": "postgres", "DATABASE_OWNER_URL": "postgres"}.get(
        variable, "amqp"
    )
    env[variable] = f"{scheme}://portal:change-me@127.0.0.1:1/portal"

    _assert_refused(_start(env), variable)


@pytest.mark.parametrize(
    "variable", ["PORTAL_AUDIT_SIGNING_KEY_FILE", "PORTAL_AUDIT_SIGNING_KEY"]
)
def test_the_web_refuses_to_be_given_the_signing_key(
    tmp_path: Path, variable: str
) -> None:
    # given a good environment with a real signing key, given to the web server
    env = _good_environment(tmp_path)
    key_file = tmp_path / "audit-signing-key.pem"
    is_file = variable.endswith("_FILE")
    env[variable] = str(key_file) if is_file else key_file.read_text()
    # (another process may hold it)
    assert _start(env).returncode == 0

    # when the web server starts, then it refuses
    _assert_refused(_start(env, WEB), variable)


def test_the_web_needs_the_public_key_file(tmp_path: Path) -> None:
    env = _good_environment(tmp_path)
    del env["PORTAL_AUDIT_PUBLIC_KEY_FILE"]

    _assert_refused(_start(env, WEB), "PORTAL_AUDIT_PUBLIC_KEY_FILE")
