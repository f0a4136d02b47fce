"""/metrics in one process (no PROMETHEUS_MULTIPROC_DIR): the token, the route label.

tests/http/test_observability.py runs the same against gunicorn and Celery workers.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from config.metrics_views import token_matches
from portal import metrics

pytestmark = pytest.mark.django_db

TOKEN = "unit-" + uuid.uuid4().hex


def test_metrics_is_off_without_a_token(client: Client, settings: Any) -> None:
    settings.PORTAL_METRICS_TOKEN = ""
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer x"}):
        answer = client.get("/metrics", headers=headers)
        assert answer.status_code == 404, headers
        assert answer["Content-Type"] == "application/problem+json"
        assert answer.json()["code"] == "NOT_FOUND"


def test_metrics_with_the_token_in_one_process(client: Client, settings: Any) -> None:
    settings.PORTAL_METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 401
    answer = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200
    families = {
        family.name
        for family in text_string_to_metric_families(answer.content.decode())
    }
    # this process's own instruments, prometheus-client's, and the database's
    assert {"portal_http_request_duration_seconds", "python_info", "portal_tasks"} <= (
        families
    )


def test_openmetrics_when_the_scraper_asks(client: Client, settings: Any) -> None:
    settings.PORTAL_METRICS_TOKEN = TOKEN
    answer = client.get(
        "/metrics",
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "Accept": "application/openmetrics-text; version=1.0.0",
        },
    )
    assert answer["Content-Type"].startswith("application/openmetrics-text")
    body = answer.content.decode()
    assert body.endswith("# EOF\n") and body.count("# EOF") == 1
    assert "portal_tasks" in body


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        (f"Bearer {TOKEN}", True),
        (f"bearer {TOKEN}", True),  # the scheme is case-insensitive (RFC 9110)
        (f"Bearer {TOKEN} ", True),
        (f"Bearer {TOKEN}x", False),
        pytest.param(f"Bearer {TOKEN[:-1]}", False, id="Bearer TOKEN[:-1]-False"),
        (f"Basic {TOKEN}", False),
        (TOKEN, False),
        ("", False),
        ("Bearer é", False),
    ],
    # The token is random: ids name it, so every process collects the same tests.
    ids=lambda value: value.replace(TOKEN, "TOKEN") if isinstance(value, str) else None,
)
def test_token_matches(header: str, matches: bool) -> None:
    assert token_matches(header, TOKEN) is matches


def latency_count(route: str, status: str) -> float:
    labels = {"method": "GET", "route": route, "status": status}
    name = "portal_http_request_duration_seconds_count"
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_request_is_timed_under_its_route_pattern(client: Client) -> None:
    route = "/api/v1/tasks/<uuid:task_id>"
    before = latency_count(route, "401")
    unmatched = latency_count(metrics.UNMATCHED_ROUTE, "404")
    client.get(f"/api/v1/tasks/{uuid.uuid4()}")  # no key: 401
    client.get(f"/api/v1/nothing-here/{uuid.uuid4()}")
    assert latency_count(route, "401") == before + 1
    assert latency_count(metrics.UNMATCHED_ROUTE, "404") == unmatched + 1
