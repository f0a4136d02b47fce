"""A fresh interpreter with the portal's settings: settings load once per process,
so a test of what an environment variable does to them runs Python anew."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable

from django.conf import settings


def run_fresh_python(
    args: list[str], *, drop: Iterable[str] = (), **overrides: str
) -> subprocess.CompletedProcess[str]:
    """``python args`` in the repository with this environment less ``drop``, plus
    ``config.settings``, no bootstrap and ``overrides``; output captured as text."""
    dropped = set(drop)
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings", PORTAL_NO_BOOTSTRAP="1", **overrides
    )
    return subprocess.run(
        [sys.executable, *args],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
