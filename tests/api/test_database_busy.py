"""A statement the database gives up on is a retryable 503, never a 500 (issue 25).

The portal sets ``lock_timeout`` and ``statement_timeout`` on every connection
(config/settings.py); reaching one, or a deadlock, rolls the request's transaction
back. Before, the error reached DRF's handler unmapped and answered 500
``INTERNAL`` (found by tests/http/test_db_partition.py's control run, where the
lock wait outlived the partition). Now: 503 ``DATABASE_BUSY`` with ``Retry-After``,
nothing kept, and the retry once the lock is free registers the task.
"""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from tasks.models import Task

from .conftest import AgentClient

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {
    "client_task_id": "busy-1",
    "workflow_key": "customer-issue",
    "workflow_version": "1",
    "object_type": "customer_issue",
    "object_id": "busy-1",
    "object_version": "1",
}


def test_a_lock_timeout_is_a_retryable_503_and_nothing_is_kept(
    api: AgentClient,
) -> None:
    # Given: another session holds the tasks table; this one waits 0.2 s at most.
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '200ms'")
    holder = psycopg.connect(
        settings.DATABASE_URL, dbname=connection.settings_dict["NAME"]
    )
    try:
        holder.execute("LOCK TABLE tasks_task IN ACCESS EXCLUSIVE MODE")
        # When: an agent registers a task.
        busy = api.post("/api/v1/tasks", BODY)
    finally:
        holder.rollback()
        holder.close()

    # Then: a retryable 503 with a stable code, not a 500; nothing kept.
    assert busy.status_code == 503, busy.content
    assert busy["Content-Type"] == "application/problem+json"
    assert busy.json()["code"] == "DATABASE_BUSY"
    assert int(busy["Retry-After"]) >= 1
    assert not Task.objects.filter(client_task_id="busy-1").exists()
    # The lock gone, the retry registers it once.
    again = api.post("/api/v1/tasks", BODY)
    assert again.status_code == 201, again.content
    assert Task.objects.filter(client_task_id="busy-1").count() == 1
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
