"""Gunicorn's settings for the portal's web server (read from the working folder).

``gunicorn portal.wsgi:application`` started in this folder reads this file by
itself; ``manage.py up`` names it with ``--config``. Settings given on the command
line win over these.
"""

from __future__ import annotations

import os

# Where to listen and how many sync workers (deploy/README.md, "Sizing"). A ``-b`` or
# ``--workers`` on the command line (``up``, the tests) wins over these.
bind = [os.environ.get("PORTAL_BIND", "127.0.0.1:8000")]
workers = int(os.environ.get("PORTAL_WEB_WORKERS", "4"))

# Gunicorn's sync worker, answering the requests gunicorn refuses itself (the limits
# below, unparsable request lines and headers) with problem+json instead of HTML.
# Sync workers close the connection after every answer (``Connection: close``):
# there is no keep-alive to get wrong after an error.
worker_class = "portal.gunicorn_worker.ProblemSyncWorker"

# Gunicorn's defaults, stated: a request line over 4094 bytes is a 414, more than
# 100 headers or one over 8190 bytes a 431 (docs/api.md, "Errors").
limit_request_line = 4094
limit_request_fields = 100
limit_request_field_size = 8190
