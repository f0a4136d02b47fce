from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from portal import process, telemetry
from portal.middleware import ProblemGuard

# Before the settings are read: this process is the web server, which never holds
# the audit signing key (portal/process.py); production settings refuse a web whose
# environment names one.
process.mark_web()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Before the handler is built: the Django instrumentation adds its middleware.
telemetry.setup("portal-web")
# ProblemGuard answers what would break Django before its middleware runs.
application = ProblemGuard(get_wsgi_application())
