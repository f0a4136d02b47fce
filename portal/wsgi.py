from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from portal.middleware import ProblemGuard

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# ProblemGuard answers what would break Django before its middleware runs.
application = ProblemGuard(get_wsgi_application())
