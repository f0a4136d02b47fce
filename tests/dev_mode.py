"""A pytest plugin, loaded first (``-p tests.dev_mode`` in pyproject.toml): tests run
the development setup, so development mode is on before Django's settings load.

The settings refuse to start without ``DJANGO_SECRET_KEY`` or ``PORTAL_DEV_MODE=1``;
this sets the latter for the test process and every child it starts (workers, web
servers, the example agent) with a copy of its environment. A test that needs the
refusal starts a child without it.
"""

from __future__ import annotations

import os

os.environ.setdefault("PORTAL_DEV_MODE", "1")
