"""Prepared statements are on at runtime, not only in the settings.

Django 5.2 hands psycopg ``prepare_threshold=None`` (never prepare) unless the
database OPTIONS name it, so the settings must (config/settings.py). These tests look
at the live connection and at the server's ``pg_prepared_statements`` of its backend.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from config import settings as portal_settings
from tasks import services
from tasks.models import TaskState

pytestmark = pytest.mark.django_db

THRESHOLD = settings.DATABASES["default"]["OPTIONS"]["prepare_threshold"]


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_the_live_connection_prepares_after_the_configured_number_of_runs():
    assert THRESHOLD == 5, "the default; PORTAL_DB_PREPARE_THRESHOLD changes it"
    connection.ensure_connection()
    assert connection.connection.prepare_threshold == THRESHOLD
    assert settings.DATABASES["default"]["OPTIONS"]["server_side_binding"] is True


def test_a_service_statement_run_often_enough_is_prepared_on_its_backend(
    make_task, actor
):
    runs = (THRESHOLD or 5) + 1  # with prepared statements off: none is prepared
    tasks = [make_task(state=TaskState.RUNNING, leased=True) for _ in range(runs)]
    assert not any("UPDATE tasks_task" in s for s in _prepared_statements())
    for task in tasks:
        services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=1,
            lease_token=task.lease_token,
            actor=actor,
        )
    prepared = _prepared_statements()
    # The transition's UPDATE and the event + outbox insert, each as psycopg sent it.
    assert any("UPDATE tasks_task" in s for s in prepared), prepared
    assert any("audit_outbox" in s for s in prepared), prepared


@pytest.mark.parametrize(
    ("binding", "value", "expected"),
    [
        (True, None, 5),
        (False, None, None),
        (True, "off", None),
        (True, "0", 0),
        (False, "12", 12),
    ],
)
def test_the_threshold_setting(monkeypatch, binding, value, expected):
    if value is None:
        monkeypatch.delenv("PORTAL_DB_PREPARE_THRESHOLD", raising=False)
    else:
        monkeypatch.setenv("PORTAL_DB_PREPARE_THRESHOLD", value)
    assert portal_settings._prepare_threshold(binding) == expected


@pytest.mark.parametrize("value", ["-1", "five"])
def test_a_bad_threshold_is_refused_at_start(monkeypatch, value):
    monkeypatch.setenv("PORTAL_DB_PREPARE_THRESHOLD", value)
    with pytest.raises(ImproperlyConfigured, match="PORTAL_DB_PREPARE_THRESHOLD"):
        portal_settings._prepare_threshold(True)
