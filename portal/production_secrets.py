"""Production refuses to start on a missing, placeholder or short secret.

``config/settings.py`` calls ``secrets_refuse_weak`` when the settings are
production's. deploy/portal.env.example ships ``change-me`` in every secret; a
deployment that forgets one must not start with it (a known ``DJANGO_SECRET_KEY``
forges sessions, a known ``PORTAL_REDACTION_SECRET`` makes the stored e-mail and
card hashes brute-forceable). Each refusal is an ``ImproperlyConfigured`` that names
the variable and how to make a good value.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from django.core.exceptions import ImproperlyConfigured

# Django's own check (security.W009) wants 50 characters and 5 different ones.
SECRET_KEY_MIN_CHARS: Final = 50
SECRET_MIN_CHARS: Final = 32
MIN_DISTINCT_CHARS: Final = 5
# Lower-case parts of the values the repository ships or suggests: deploy's
# placeholders, Django's "django-insecure-" keys, the development default.
PLACEHOLDER_PARTS: Final = ("change-me", "changeme", "change_me", "insecure", "example")
RANDOM_COMMAND: Final = 'python3 -c "import secrets; print(secrets.token_urlsafe({n}))"'
MAKE_KEY: Final = "openssl genpkey -algorithm ed25519 -out audit-signing-key.pem"
MAKE_PUBLIC: Final = (
    "openssl pkey -in audit-signing-key.pem -pubout -out audit-public-key.pem"
)
# URLs whose password deploy/portal.env.example ships as change-me.
URLS_WITH_PASSWORDS: Final = (
    "DATABASE_URL",
    "DATABASE_OWNER_URL",
    "CELERY_BROKER_URL",
    "PORTAL_EVENTS_BROKER_URL",
)


def _is_placeholder(value: str) -> bool:
    lowered = value.lower()
    return any(part in lowered for part in PLACEHOLDER_PARTS)


def _secret_refuse(
    environ: Mapping[str, str], name: str, *, min_chars: int, required: bool
) -> None:
    value = environ.get(name, "")
    how = f"make one with {RANDOM_COMMAND.format(n=min_chars)}"
    if not value:
        if required:
            raise ImproperlyConfigured(f"{name} is not set: production needs it; {how}")
        return
    if _is_placeholder(value):
        raise ImproperlyConfigured(
            f"{name} is a placeholder (deploy/portal.env.example's change-me, or a "
            f"development or example value); {how}"
        )
    if len(value) < min_chars or len(set(value)) < MIN_DISTINCT_CHARS:
        raise ImproperlyConfigured(
            f"{name} is too short or too plain: at least {min_chars} characters, "
            f"{MIN_DISTINCT_CHARS} of them different; {how}"
        )


def _pem_of(environ: Mapping[str, str], name: str) -> bytes | None:
    """The PEM a variable names: its text, or (``…_FILE``) the file's bytes."""
    value = environ.get(name, "")
    if not value:
        return None
    if _is_placeholder(value):
        raise ImproperlyConfigured(
            f"{name} is a placeholder, not a key; make the key with {MAKE_KEY}"
        )
    if not name.endswith("_FILE"):
        return value.encode()
    try:
        return Path(value).read_bytes()
    except OSError as error:
        raise ImproperlyConfigured(
            f"{name}={value}: cannot read it ({error.strerror}); make the key with "
            f"{MAKE_KEY}, readable by the portal's user"
        ) from None


def _signing_key_refuse(environ: Mapping[str, str], name: str) -> None:
    pem = _pem_of(environ, name)
    if pem is None:
        return
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(
            f"{name} does not hold an unencrypted Ed25519 private key in PEM; make "
            f"one with {MAKE_KEY}"
        )


def _public_key_refuse(environ: Mapping[str, str], name: str) -> None:
    pem = _pem_of(environ, name)
    if pem is None:
        return
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise ImproperlyConfigured(
            f"{name} does not hold an Ed25519 public key in PEM; make it from the "
            f"signing key with {MAKE_PUBLIC}"
        )


def _url_password_refuse(environ: Mapping[str, str], name: str) -> None:
    value = environ.get(name, "")
    try:
        password = urlsplit(value).password if value else None
    except ValueError:  # not a URL: the settings' own parsing reports it
        return
    if password and _is_placeholder(password):
        raise ImproperlyConfigured(
            f"{name}'s password is a placeholder; give the role a real password "
            f"(e.g. {RANDOM_COMMAND.format(n=32)}) and put it in the URL"
        )


def secrets_refuse_weak(environ: Mapping[str, str], *, web: bool) -> None:
    """Refuse production settings whose secrets are missing, placeholders or short.

    ``DJANGO_SECRET_KEY`` (50+ characters) and ``PORTAL_REDACTION_SECRET`` (32+, no
    silent fallback to the secret key in production) are required; the metrics
    token is checked when set. The audit keys must be real Ed25519 PEM: the private
    key where it is configured (the Celery worker), the public key file everywhere
    it is set and in the web always. The web (``web``: ``config/wsgi.py`` marked the
    process) must not be given the private key at all. The passwords in the
    database, broker and Redis URLs must not be placeholders.

    Raises:
        ImproperlyConfigured: naming the first variable refused and how to fix it.
    """
    _secret_refuse(
        environ, "DJANGO_SECRET_KEY", min_chars=SECRET_KEY_MIN_CHARS, required=True
    )
    _secret_refuse(
        environ, "PORTAL_REDACTION_SECRET", min_chars=SECRET_MIN_CHARS, required=True
    )
    _secret_refuse(
        environ, "PORTAL_METRICS_TOKEN", min_chars=SECRET_MIN_CHARS, required=False
    )
    for name in ("PORTAL_AUDIT_SIGNING_KEY", "PORTAL_AUDIT_SIGNING_KEY_FILE"):
        if web and environ.get(name):
            raise ImproperlyConfigured(
                f"{name} is set for the web server, which must not hold the audit "
                "signing key: give it to the Celery workers only (deploy/README.md) "
                "and give the web PORTAL_AUDIT_PUBLIC_KEY_FILE"
            )
        _signing_key_refuse(environ, name)
    if web and not environ.get("PORTAL_AUDIT_PUBLIC_KEY_FILE"):
        raise ImproperlyConfigured(
            "PORTAL_AUDIT_PUBLIC_KEY_FILE is not set: the web server publishes the "
            f"audit public key from it; make it with {MAKE_PUBLIC}"
        )
    _public_key_refuse(environ, "PORTAL_AUDIT_PUBLIC_KEY_FILE")
    for name in URLS_WITH_PASSWORDS:
        _url_password_refuse(environ, name)
