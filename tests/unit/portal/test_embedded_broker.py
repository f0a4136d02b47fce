"""The embedded broker (kombu's filesystem transport, the default when no broker is
configured) connects without kombu's "No hostname was supplied" warning, which
``manage.py up`` printed before its banner.

A fresh interpreter: settings load once per process, and the test settings name a
real broker.
"""

from __future__ import annotations

from tests.support.fresh_python import run_fresh_python

# What the portal's processes do with the broker URL: Celery's connection, cloned as
# its producer pool does, and the relay's own connection.
CONNECT = """
import logging
logging.basicConfig(level=logging.WARNING)
import django
django.setup()
from django.conf import settings
from kombu import Connection
from config.celery import app
with app.connection_for_write() as connection:
    connection.clone().release()
Connection(settings.PORTAL_EVENTS_BROKER_URL).clone().release()
print(settings.CELERY_BROKER_URL, settings.PORTAL_EVENTS_BROKER_URL)
"""


def test_the_embedded_broker_connects_without_a_hostname_warning():
    loaded = run_fresh_python(
        ["-c", CONNECT],
        drop=("CELERY_BROKER_URL", "PORTAL_EVENTS_BROKER_URL"),
        PORTAL_DEV_MODE="1",
    )
    assert loaded.returncode == 0, loaded.stderr
    celery_url, events_url = loaded.stdout.split()
    assert celery_url.startswith("filesystem://")
    assert events_url == celery_url
    assert "No hostname was supplied" not in loaded.stderr, loaded.stderr
