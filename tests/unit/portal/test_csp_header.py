"""Every kind of answer carries a Content-Security-Policy (issue 19 §1): the pages
the strict one, everything else one that loads nothing and is framed nowhere."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

PAGE = ("default-src 'self'", "object-src 'none'", "frame-ancestors 'none'")
NOT_HTML = {"default-src 'none'", "frame-ancestors 'none'"}


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/admin/login/", 200),
        ("/api/docs/", 200),
        ("/api/redoc/", 200),
        ("/no-such-page", 404),
    ],
)
def test_pages_carry_the_strict_policy(path: str, status: int):
    response = Client().get(path)
    assert response.status_code == status
    policy = response["Content-Security-Policy"]
    assert all(directive in policy for directive in PAGE)
    assert "unsafe-inline" not in policy


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/", 200),  # JSON
        ("/api/v1/tasks", 401),  # problem+json
        ("/api/v1/no-such-thing", 404),  # Django's 404, rewritten as problem+json
        ("/api/schema/", 200),
        ("/api/docs/?script", 200),  # Swagger UI's start script
        ("/healthz", 200),
        ("/metrics", 404),  # no token configured
    ],
)
def test_other_answers_carry_the_load_nothing_policy(path: str, status: int):
    response = Client().get(path)
    assert response.status_code == status
    policy = response["Content-Security-Policy"]
    assert {directive.strip() for directive in policy.split(";")} == NOT_HTML
