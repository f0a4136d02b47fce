"""``GET /healthz`` (the process answers) and ``GET /readyz`` (it can do its work).

Neither needs authentication, and neither says more than which check failed: no
exception text, host or URL leaves the server (the log has them). A failed
readiness check is a 503 problem+json (``portal.problems``) with code ``NOT_READY``
and a ``checks`` member; docs/observability.md, "Health", says what each checks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from portal.problems import PROBLEM_CONTENT_TYPE, encode, problem_body

logger = logging.getLogger(__name__)

# How long the broker may take to accept a connection before it counts as down.
BROKER_CONNECT_TIMEOUT_S: Final = 2.0


def database_reachable() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def broker_reachable() -> None:
    """Open (and close) a connection to the Celery broker, no retries."""
    from config.celery import app

    with app.connection_for_write(connect_timeout=BROKER_CONNECT_TIMEOUT_S) as broker:
        broker.ensure_connection(max_retries=0)


class MigrationsPending(Exception):
    pass


def migrations_applied() -> None:
    """Every migration on disk is recorded in the database's django_migrations."""
    executor = MigrationExecutor(connection)
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        raise MigrationsPending


CHECKS: Final[dict[str, Callable[[], None]]] = {
    "database": database_reachable,
    "broker": broker_reachable,
    "migrations": migrations_applied,
}


@csrf_exempt  # no session is read: any write method is a 405, not a 403
@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    """The process serves requests; touches nothing else (no database)."""
    return JsonResponse({"status": "ok"})


@csrf_exempt  # no session is read: any write method is a 405, not a 403
@require_safe
def readyz(request: HttpRequest) -> HttpResponse:
    """200 when the database, the broker and the migrations are all fine, else 503."""
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        try:
            check()
        except Exception:
            logger.warning("readiness check %s failed", name, exc_info=True)
            results[name] = "failed"
        else:
            results[name] = "ok"
    failed = [name for name, result in results.items() if result != "ok"]
    if not failed:
        return JsonResponse({"status": "ok", "checks": results})
    body = problem_body(
        status=503,
        code="NOT_READY",
        detail=f"Not ready: {', '.join(failed)}.",
        checks=results,
    )
    response = HttpResponse(encode(body), status=503, content_type=PROBLEM_CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
