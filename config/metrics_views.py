"""``GET /metrics``: the Prometheus exposition, behind a bearer token.

The counters and the latency histogram come from every process of this host that
shares ``PROMETHEUS_MULTIPROC_DIR`` (gunicorn's workers, the Celery worker's pool);
the gauges below are read from the database at scrape time, one function per metric
family, each one statement:

===================================  ==========================================
metric family                        function
===================================  ==========================================
``portal_tasks``                     ``tasks.selectors.open_task_counts``
``portal_takeover_queue_*``          ``tasks.selectors.takeover_queue_stats``
``portal_outbox_*``                  ``audit.relay.outbox_backlog``
===================================  ==========================================

Each reads the tenants in scope; a scrape is the operator's view of the whole
portal, so it reads in the scope of every tenant (``portal.scope.every_tenant``).

Wiring above the apps (like ``config.urls``): it imports ``tasks`` and ``audit``.
docs/observability.md, "Metrics", lists every metric and says how to scrape.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, Final

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from audit import relay
from portal import scope
from portal.problems import PROBLEM_CONTENT_TYPE, encode, status_problem
from tasks import selectors as task_selectors

logger = logging.getLogger(__name__)

# A scrape must never hold the database long: each read gets this much.
SCRAPE_STATEMENT_TIMEOUT_MS: Final = 5000


def _timed_read(read: Callable[[], Any]) -> Any:
    """``read`` in a short transaction of its own, under the scrape's time limit, in
    the scope of every tenant (row-level security)."""
    with scope.every_tenant(), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)",
                [str(SCRAPE_STATEMENT_TIMEOUT_MS)],
            )
        return read()


class DatabaseCollector(Collector):
    """The gauges that the database knows, read when ``/metrics`` is scraped."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "portal_metrics_database_up",
            "1 if every database-backed gauge of this scrape could be read, else 0.",
        )
        ok = True
        for read in (self._tasks, self._takeover, self._outbox):
            try:
                yield from _timed_read(read)
            except Exception:
                # The scrape goes on without these gauges; the log says why.
                logger.exception("metrics: %s could not be read", read.__name__)
                ok = False
        up.add_metric([], 1.0 if ok else 0.0)
        yield up

    @staticmethod
    def _tasks() -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "portal_tasks",
            "Unfinished tasks of all tenants, by state and reason code ('' for none).",
            labels=["state", "reason"],
        )
        for state, reason, count in task_selectors.open_task_counts():
            family.add_metric([state, reason], count)
        return [family]

    @staticmethod
    def _takeover() -> list[GaugeMetricFamily]:
        stats = task_selectors.takeover_queue_stats()
        size = GaugeMetricFamily(
            "portal_takeover_queue_size",
            "Tasks in the takeover queue, by state (human_required: waiting for a "
            "person; human_claimed: a person has it).",
            labels=["state"],
        )
        age = GaugeMetricFamily(
            "portal_takeover_queue_oldest_age_seconds",
            "Seconds since the longest-waiting task of each state last changed.",
            labels=["state"],
        )
        for state in ("human_required", "human_claimed"):
            size.add_metric([state], stats.size.get(state, 0))
            age.add_metric([state], stats.oldest_age_s.get(state, 0.0))
        return [size, age]

    @staticmethod
    def _outbox() -> list[GaugeMetricFamily]:
        backlog = relay.outbox_backlog()
        families = []
        for name, value, meaning in (
            ("pending", backlog.pending, "Outbox rows not yet published."),
            ("due", backlog.due, "Pending outbox rows due now (not backing off)."),
            ("dead", backlog.dead, "Outbox rows the relay gave up on."),
        ):
            family = GaugeMetricFamily(f"portal_outbox_{name}", meaning)
            family.add_metric([], value)
            families.append(family)
        lag = GaugeMetricFamily(
            "portal_outbox_oldest_pending_age_seconds",
            "The relay's lag: age of the oldest unpublished outbox row (0 if none).",
        )
        lag.add_metric([], backlog.oldest_pending_age_s or 0.0)
        families.append(lag)
        return families


def exposition(accept: str = "") -> tuple[bytes, str]:
    """The metrics text and its content type (OpenMetrics when ``accept`` asks):
    this host's processes' instruments, then the database's gauges."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:  # one process: its own instruments
        registry.register(REGISTRY)
    registry.register(DatabaseCollector())
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def _problem(status: int, **headers: str) -> HttpResponse:
    response = HttpResponse(
        encode(status_problem(status)), status=status, content_type=PROBLEM_CONTENT_TYPE
    )
    for name, value in headers.items():
        response[name] = value
    return response


def token_matches(header: str, token: str) -> bool:
    """Whether ``Authorization`` is ``Bearer <token>`` (constant-time comparison)."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


@csrf_exempt  # no session is read: any write method is a 405, not a 403
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """404 while ``PORTAL_METRICS_TOKEN`` is unset; 401 without its bearer token."""
    token = settings.PORTAL_METRICS_TOKEN
    if not token:
        return _problem(404)
    if not token_matches(request.headers.get("Authorization", ""), token):
        return _problem(401, **{"WWW-Authenticate": 'Bearer realm="metrics"'})
    body, content_type = exposition(request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)
