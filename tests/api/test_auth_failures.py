"""Bursts of invalid keys are throttled per source address and per key prefix
(issue 25, S07): counted in PostgreSQL, answered 429 problem+json with Retry-After,
logged without key material."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from django.db.models import F
from rest_framework.test import APIClient

from audit.models import Event
from portal import services as portal_services
from portal.models import AgentKey

from .conftest import AgentClient

LIMIT = 3


@pytest.fixture
def low_limit(settings):
    rates = {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]}
    rates["auth_failure"] = f"{LIMIT}/min"
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": rates,
    }


def _get(secret: str, address: str):
    http = APIClient(REMOTE_ADDR=address)
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return http.get("/api/v1/tasks")


def test_an_address_over_the_limit_is_refused_even_with_a_right_key(
    api: AgentClient, low_limit, caplog
):
    # Given LIMIT failed authentications from one address
    with caplog.at_level(logging.WARNING, logger="portal.api"):
        for i in range(LIMIT):
            answer = _get(f"nope{i}.guess-{i}", "198.51.100.7")
            assert answer.status_code == 401, answer.json()
        # When it fails once more, then sends a right key
        over = _get("nope.again", "198.51.100.7")
        right = _get(api.secret, "198.51.100.7")
    # Then both are 429 problems with Retry-After, while another address with the
    # right key is served
    for answer in (over, right):
        assert answer.status_code == 429, answer.json()
        assert answer["Content-Type"] == "application/problem+json"
        assert answer.json()["code"] == "RATE_LIMITED"
        assert 1 <= int(answer["Retry-After"]) <= 60
    assert _get(api.secret, "198.51.100.8").status_code == 200
    # And the failures were logged, without any of the secrets sent
    lines = [r for r in caplog.records if r.getMessage() == "API authentication failed"]
    assert len(lines) == LIMIT + 1
    text = " ".join(str(vars(r)) for r in lines)
    assert "guess-" not in text and "again" not in text
    assert api.secret.split(".", 1)[1] not in text


def test_a_prefix_over_the_limit_is_429_but_its_agent_keeps_working(
    api: AgentClient, low_limit
):
    """Throttled by prefix, not locked out by it: anyone may know a key's prefix."""
    prefix = api.secret.split(".")[0]
    # Given wrong secrets for a real prefix, each from another address
    answers = [_get(f"{prefix}.wrong-{i}", f"203.0.113.{i}") for i in range(LIMIT + 1)]
    # Then the failures past the limit are 429, the ones before 401
    assert [a.status_code for a in answers] == [401] * LIMIT + [429]
    assert answers[-1]["Retry-After"]
    # And the agent with its right key, from a fresh address, is served
    assert _get(api.secret, "203.0.113.200").status_code == 200


def test_a_revoked_or_expired_key_counts_as_a_failure(api: AgentClient, low_limit):
    portal_services.agent_key_revoke(key=api.agent.keys.get())
    statuses = [_get(api.secret, "192.0.2.9").status_code for _ in range(LIMIT + 1)]
    assert statuses == [401] * LIMIT + [429]


@pytest.mark.parametrize("status", ["revoked", "expired"])
def test_a_known_retired_key_is_recorded_in_its_tenant_until_throttled(
    api: AgentClient, low_limit, status: str
):
    """The exact secret of a revoked or expired key is in someone's hands: its
    tenant's record says so (``agent_key.refused``), once per refused request, and
    no more once the throttle answers 429. A wrong secret for the same prefix is
    not the key's holder: nothing is written."""
    key = api.agent.keys.get()
    if status == "revoked":
        portal_services.agent_key_revoke(key=key)
    else:
        AgentKey.objects.filter(pk=key.pk).update(
            expires_at=F("created_at") + dt.timedelta(microseconds=1)
        )
    prefix = api.secret.split(".")[0]
    assert _get(f"{prefix}.not-the-secret", "192.0.2.20").status_code == 401
    statuses = [_get(api.secret, "192.0.2.21").status_code for _ in range(LIMIT)]
    assert statuses == [401] * (LIMIT - 1) + [429]  # the wrong secret counted too
    events = Event.objects.filter(tenant=api.tenant, code="agent_key.refused")
    assert events.count() == LIMIT - 1
    payloads = [event.payload for event in events]
    assert all(
        (p["key_prefix"], p["status"], p["address"], p["path"])
        == (prefix, status, "192.0.2.21", "/api/v1/tasks")
        for p in payloads
    ), payloads
    assert {p["code"] for p in payloads} == {f"API_KEY_{status.upper()}"}
    assert api.secret.split(".", 1)[1] not in str(payloads)
