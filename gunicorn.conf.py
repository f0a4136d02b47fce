"""Gunicorn's settings for the portal's web server (read from the working folder).

``gunicorn portal.wsgi:application`` started in this folder reads this file by
itself; ``manage.py up`` names it with ``--config``. Settings given on the command
line win over these.
"""

from __future__ import annotations

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


def post_fork(server: object, worker: object) -> None:
    """Each worker process sets up its own tracer provider (portal/telemetry.py),
    also when the application is preloaded in the arbiter."""
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    from portal import telemetry

    telemetry.setup("portal-web")
