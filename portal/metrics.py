"""The portal's Prometheus instruments: what happens, counted where it happens.

Each counter has one caller, the single code path of its event (docs/observability.md,
"Metrics"): the gateway's ``checks.checked`` (verdicts), the lease reaper
(``tasks.services.unscoped_leases_reap``), the Celery signals in ``config.celery``
(job outcomes) and ``HttpMetricsMiddleware`` (request latency). What the database
knows (tasks by state, the takeover queue, the outbox) is read when ``/metrics`` is
scraped (``config.metrics_views``), never counted here.

Multiprocess: with ``PROMETHEUS_MULTIPROC_DIR`` set before this module is imported
(``gunicorn.conf.py`` sets it for its workers; the Celery worker gets it from its
environment), every process writes its values to files there and a scrape sums them
(prometheus-client's multiprocess mode). Without it, the values live in this process.

A base module: imports nothing of ``tasks`` or ``audit`` (tests/unit/test_layering.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from prometheus_client import Counter, Histogram

# Requests whose method is none of these count as "other": a client must not be able
# to make a new series by inventing methods.
_METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)
# The route of a request no URL pattern matched (404s, gunicorn never gets here).
UNMATCHED_ROUTE: Final = "<unmatched>"

HTTP_REQUEST_DURATION: Final = Histogram(
    "portal_http_request_duration_seconds",
    "Time from the request reaching Django to its response being made (a streamed "
    "body is sent after), by the URL pattern that matched (never the raw path).",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
GATEWAY_VERDICTS: Final = Counter(
    "portal_gateway_verdicts",
    "Gateway check verdicts, committed: which check, passed or refused, and the "
    "refusal's reason code ('' when passed).",
    ["check", "verdict", "reason"],
)
LEASE_EXPIRIES: Final = Counter(
    "portal_lease_expiries",
    "Lapsed leases the reaper took back, by the state the task was in (running: an "
    "agent's lease; human_claimed: a person's claim).",
    ["state"],
)
SLA_BREACHES: Final = Counter(
    "portal_sla_breaches",
    "Desk items escalated for passing their SLA (routing/), by reason code.",
    ["reason_code"],
)
CELERY_JOB_OUTCOMES: Final = Counter(
    "portal_celery_job_outcomes",
    "Celery jobs finished, by job name and outcome (success, failure, retry, "
    "revoked, rejected).",
    ["job", "outcome"],
)


def gateway_verdict_counted(*, check: str, reason: str | None) -> None:
    """Count one check's verdict when the transaction that wrote it commits."""
    verdict = "refused" if reason else "passed"
    transaction.on_commit(
        lambda: GATEWAY_VERDICTS.labels(check, verdict, reason or "").inc()
    )


def lease_expiries_counted(*, states: list[str]) -> None:
    """Count the reaper's batch (one entry per task) when its transaction commits."""

    def count() -> None:
        for state in states:
            LEASE_EXPIRIES.labels(state).inc()

    if states:
        transaction.on_commit(count)


def sla_breach_counted(*, reason_code: str) -> None:
    """Count one SLA breach when the transaction that escalated the item commits."""
    transaction.on_commit(lambda: SLA_BREACHES.labels(reason_code).inc())


def job_outcome_counted(*, job: str, outcome: str) -> None:
    CELERY_JOB_OUTCOMES.labels(job, outcome).inc()


def request_route(request: HttpRequest) -> str:
    """The matched URL pattern, e.g. ``/api/v1/tasks/<uuid:task_id>``."""
    match = getattr(request, "resolver_match", None)
    if match is None or match.route is None:
        return UNMATCHED_ROUTE
    return "/" + match.route


class HttpMetricsMiddleware:
    """Times every request Django answers, labelled by route, method and status.

    Outermost in ``MIDDLEWARE``: the time includes every other middleware, and the
    status is the one the client gets (also a problem+json error answer).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        method = request.method if request.method in _METHODS else "other"
        HTTP_REQUEST_DURATION.labels(
            method, request_route(request), str(response.status_code)
        ).observe(time.perf_counter() - started)
        return response
