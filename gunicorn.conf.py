"""Gunicorn's settings for the portal's web server (read from the working folder).

``gunicorn config.wsgi:application`` started in this folder reads this file by
itself; ``manage.py up`` names it with ``--config``. Settings given on the command
line win over these.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

# Where to listen, how many worker processes and how many threads each
# (deploy/README.md, "Sizing"). A ``-b``, ``--workers`` or ``--threads`` on the command
# line (``up``, the tests) wins over these.
bind = [os.environ.get("PORTAL_BIND", "127.0.0.1:8000")]
workers = int(os.environ.get("PORTAL_WEB_WORKERS", "2"))
_WORKER = os.environ.get("PORTAL_WEB_WORKER_CLASS", "gthread")

# Gunicorn's threaded worker (gthread): each process serves ``threads`` requests at
# once and keeps idle connections open for ``keepalive`` seconds in its poller, so an
# agent holding a connection pays no new TCP connection per request. Its answers to
# requests gunicorn refuses itself (the limits below, unparsable request lines and
# headers) are problem+json instead of HTML, and an answer given before the body
# was read either reads a small rest away or closes the connection
# (config/gunicorn_worker.py). ``PORTAL_WEB_WORKER_CLASS=sync`` runs the sync worker
# instead: one request per process, every answer ``Connection: close``.
# (Gunicorn runs its stock gthread worker instead of a sync worker given threads > 1.)
worker_class = {
    "gthread": "config.gunicorn_worker.ProblemThreadWorker",
    "sync": "config.gunicorn_worker.ProblemSyncWorker",
}[_WORKER]
threads = int(os.environ.get("PORTAL_WEB_THREADS", "4")) if _WORKER == "gthread" else 1
keepalive = int(os.environ.get("PORTAL_WEB_KEEPALIVE_S", "15"))

# Gunicorn's defaults, stated: a request line over 4094 bytes is a 414, more than
# 100 headers or one over 8190 bytes a 431 (docs/api.md, "Errors").
limit_request_line = 4094
limit_request_fields = 100
limit_request_field_size = 8190


# Prometheus multiprocess mode (docs/observability.md, "Metrics"): each worker writes
# its counters to files in PROMETHEUS_MULTIPROC_DIR and /metrics sums them. The
# folder must be set before a worker imports prometheus_client, so the master sets
# it here, before it forks any. Without one from the environment (a deployment
# shares its folder with the Celery worker), a private folder for this master.
_PRIVATE_METRICS_DIR: list[str] = []


def on_starting(server: Any) -> None:
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
    else:
        folder = tempfile.mkdtemp(prefix="portal-metrics-")
        _PRIVATE_METRICS_DIR.append(folder)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder


def child_exit(server: Any, worker: Any) -> None:
    """A worker ended: its live gauges leave the sums (its counters stay)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    for folder in _PRIVATE_METRICS_DIR:
        shutil.rmtree(folder, ignore_errors=True)


def post_fork(server: object, worker: object) -> None:
    """Each worker process sets up its own tracer provider (portal/telemetry.py),
    also when the application is preloaded in the arbiter."""
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from portal import telemetry

    telemetry.setup("portal-web")
