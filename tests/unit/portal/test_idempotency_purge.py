from __future__ import annotations

import pytest
from django.db import connection

from portal import idempotency
from portal.jobs import purge_idempotent_requests_job
from portal.models import IdempotentRequest


@pytest.mark.django_db
def test_the_purge_job_deletes_only_expired_records(agent, settings):
    idempotency.idempotent_request_begin(agent=agent, key="old", fingerprint="f")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE portal_idempotentrequest SET expires_at = app_now() - interval '1 s'"
        )
    idempotency.idempotent_request_begin(agent=agent, key="fresh", fingerprint="f")
    assert purge_idempotent_requests_job() == 1
    assert list(IdempotentRequest.objects.values_list("key", flat=True)) == [
        idempotency.stored_key("fresh")
    ]
    assert "portal.jobs.purge_idempotent_requests_job" in {
        entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()
    }
