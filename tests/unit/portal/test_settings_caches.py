"""Every cache the settings configure works, whatever the environment offers: the
README once offered REDIS_URL, which made Django's cache Redis although the
``redis`` package is not installed, so its first use failed. Nothing in the portal
uses Django's cache (the API throttle counts in PostgreSQL, docs/limits.md), and
REDIS_URL is gone.

A fresh interpreter, since settings load once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

USE_EVERY_CACHE = """
import django
django.setup()
from django.conf import settings
from django.core.cache import caches
for alias in settings.CACHES:
    caches[alias].set("probe", 42)
    assert caches[alias].get("probe") == 42, alias
    print(alias, settings.CACHES[alias]["BACKEND"])
"""


def test_every_configured_cache_works_with_redis_url_set():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.update(
        PORTAL_DEV_MODE="1",
        PORTAL_NO_BOOTSTRAP="1",
        # The machine's Redis, as the README offered it.
        REDIS_URL="redis://127.0.0.1:6379/0",
    )

    used = subprocess.run(
        [sys.executable, "-c", USE_EVERY_CACHE],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert used.returncode == 0, used.stderr[-2000:]
    assert "default django.core.cache.backends.locmem.LocMemCache" in used.stdout


def test_no_document_offers_redis_url():
    repo = Path(settings.BASE_DIR)
    for path in ("README.md", "deploy/portal.env.example", "config/settings.py"):
        assert "REDIS_URL" not in (repo / path).read_text(), path
