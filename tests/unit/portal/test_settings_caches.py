"""Every cache the settings configure works, whatever the environment offers: the
README once offered REDIS_URL, which made Django's cache Redis although the
``redis`` package is not installed, so its first use failed. Nothing in the portal
uses Django's cache (the API throttle counts in PostgreSQL, docs/limits.md), and
REDIS_URL is gone.

A fresh interpreter, since settings load once per process.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from tests.support.fresh_python import run_fresh_python

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
    used = run_fresh_python(
        ["-c", USE_EVERY_CACHE],
        PORTAL_DEV_MODE="1",
        # The machine's Redis, as the README offered it.
        REDIS_URL="redis://127.0.0.1:6379/0",
    )

    assert used.returncode == 0, used.stderr[-2000:]
    assert "default django.core.cache.backends.locmem.LocMemCache" in used.stdout


def test_no_document_offers_redis_url():
    repo = Path(settings.BASE_DIR)
    for path in ("README.md", "deploy/portal.env.example", "config/settings.py"):
        assert "REDIS_URL" not in (repo / path).read_text(), path
