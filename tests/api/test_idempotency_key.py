"""The Idempotency-Key header (IETF httpapi draft): replay, mismatch, in flight, expiry."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from audit.models import Event
from portal import idempotency
from tasks import services
from tasks.models import Task
from tests.support.concurrency import run_in_threads
from tests.support.db import db_clock_offset

from .conftest import REGISTRATION, register_and_claim

KEY = {"Idempotency-Key": "register-issue-1042"}


@pytest.mark.django_db
def test_a_replay_returns_the_first_answer_and_does_nothing(api):
    first = api.post("/api/v1/tasks", REGISTRATION, **KEY)
    again = api.post("/api/v1/tasks", REGISTRATION, **KEY)
    assert first.status_code == again.status_code == 201  # the stored status, not 200
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert Task.objects.count() == 1
    assert Event.objects.count() == 1


@pytest.mark.django_db
def test_an_error_answer_is_replayed_too(api):
    task = register_and_claim(api)
    body = {"to": "succeeded", "expected_state_version": 99}
    headers = {"Lease-Token": str(task["lease"]["token"]), "Idempotency-Key": "t-1"}
    first = api.post(f"/api/v1/tasks/{task['id']}/transitions", body, **headers)
    again = api.post(f"/api/v1/tasks/{task['id']}/transitions", body, **headers)
    assert first.status_code == again.status_code == 409
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bad_body",
    [
        {k: v for k, v in REGISTRATION.items() if k != "object_id"},  # missing
        {**REGISTRATION, "object_version": ""},  # empty
        b"{not json",  # malformed: MALFORMED_REQUEST
    ],
    ids=["missing-member", "empty-member", "not-json"],
)
def test_a_400_is_not_stored_so_the_corrected_request_runs_under_the_same_key(
    api, bad_body
):
    """The draft: a client corrects a refused request before retrying it; a
    refused request completed nothing, so there is nothing to replay."""
    # Given a registration refused with 400 under a key
    if isinstance(bad_body, bytes):
        refused = api.http.post(
            "/api/v1/tasks", bad_body, content_type="application/json", headers=KEY
        )
    else:
        refused = api.post("/api/v1/tasks", bad_body, **KEY)
    assert refused.status_code == 400
    assert refused.json()["code"] in ("VALIDATION_FAILED", "MALFORMED_REQUEST")
    # When the corrected request is sent under the same key
    corrected = api.post("/api/v1/tasks", REGISTRATION, **KEY)
    # Then it runs as a first delivery, and from then on is replayed
    assert corrected.status_code == 201, corrected.json()
    assert "Idempotent-Replayed" not in corrected
    again = api.post("/api/v1/tasks", REGISTRATION, **KEY)
    assert again["Idempotent-Replayed"] == "true"
    assert Task.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_422(api):
    api.post("/api/v1/tasks", REGISTRATION, **KEY)
    response = api.post("/api/v1/tasks", {**REGISTRATION, "client_task_id": "x"}, **KEY)
    assert response.status_code == 422
    assert response.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"
    assert Task.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_on_another_endpoint_is_422(api):
    api.post("/api/v1/tasks", REGISTRATION, **KEY)
    response = api.post("/api/v1/tasks/claim-next", {"owner": "w"}, **KEY)
    assert response.status_code == 422


@pytest.mark.django_db
def test_keys_are_scoped_per_agent(api, make_client):
    colleague = make_client(tenant=api.tenant)
    api.post("/api/v1/tasks", REGISTRATION, **KEY)
    other = colleague.post(
        "/api/v1/tasks", {**REGISTRATION, "client_task_id": "x"}, **KEY
    )
    assert other.status_code == 201
    assert "Idempotent-Replayed" not in other


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "x" * 256, "clé", "has space"])
def test_malformed_keys_are_400(api, key):
    response = api.post("/api/v1/tasks", REGISTRATION, **{"Idempotency-Key": key})
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert not Task.objects.exists()


@pytest.mark.django_db
def test_a_key_expires_after_the_window(api):
    api.post("/api/v1/tasks", REGISTRATION, **KEY)
    window = settings.PORTAL_IDEMPOTENCY_WINDOW_S
    with db_clock_offset(window + 1):  # the one SQL clock moves past the window
        response = api.post(
            "/api/v1/tasks", {**REGISTRATION, "client_task_id": "y"}, **KEY
        )
    assert response.status_code == 201
    assert Task.objects.count() == 2


@pytest.mark.django_db
def test_a_server_error_frees_the_key_for_a_retry(api, monkeypatch):
    original = services.task_register

    def crash(**kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(services, "task_register", crash)
    failed = api.post("/api/v1/tasks", REGISTRATION, **KEY)
    assert failed.status_code == 500
    assert failed["Content-Type"] == "application/problem+json"
    assert failed.json()["code"] == "INTERNAL"
    assert failed.json()["correlation_id"]
    monkeypatch.setattr(services, "task_register", original)
    retried = api.post("/api/v1/tasks", REGISTRATION, **KEY)
    assert retried.status_code == 201
    assert "Idempotent-Replayed" not in retried


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_while_the_first_is_in_flight_is_409(api):
    """The first delivery is held on a row lock; its duplicate is told it is in flight."""
    task = register_and_claim(api)
    path = f"/api/v1/tasks/{task['id']}/transitions"
    body = {"to": "succeeded", "expected_state_version": task["state_version"]}
    headers = {
        "Lease-Token": str(task["lease"]["token"]),
        "Idempotency-Key": "finish-1",
    }
    db = settings.DATABASES["default"]
    side = psycopg.connect(
        host=db["HOST"],
        port=db["PORT"] or 5432,
        user=db["USER"],
        dbname=connection.settings_dict["NAME"],
        autocommit=False,
    )
    first_started = threading.Event()
    try:
        with side.cursor() as cursor:  # hold the task row: the first request blocks
            cursor.execute(  # in the task's tenant (row-level security)
                "SELECT set_config('portal.tenant_ids', %s, true)",
                [str(Task.objects.get(pk=task["id"]).tenant_id)],
            )
            cursor.execute(
                "SELECT 1 FROM tasks_task WHERE id = %s FOR UPDATE", [task["id"]]
            )
            assert cursor.rowcount == 1

        def first():
            first_started.set()
            return api.post(path, body, **headers)

        def duplicate():
            first_started.wait(5)
            # Wait until the first request holds its in-flight marker.
            for _ in range(100):
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM portal_idempotentrequest WHERE key = %s",
                        [idempotency.stored_key("finish-1")],
                    )
                    if cursor.fetchone()[0]:
                        break
                threading.Event().wait(0.05)
            response = api.post(path, body, **headers)
            side.rollback()  # release the row: the first request may finish now
            return response

        first_response, duplicate_response = run_in_threads(first, duplicate)
    finally:
        side.close()
    assert duplicate_response.status_code == 409, duplicate_response.content
    assert duplicate_response.json()["code"] == "REQUEST_IN_FLIGHT"
    assert first_response.status_code == 200, first_response.content
    replay = api.post(path, body, **headers)
    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"
    assert (
        Event.objects.filter(code="task.transitioned", task_id=task["id"]).count() == 2
    )


@pytest.mark.django_db
def test_the_same_key_under_another_lease_token_is_another_request(api):
    """A write under another fencing token is not a replay (found by the client work)."""
    task = register_and_claim(api)
    path = f"/api/v1/tasks/{task['id']}/lease/renew"
    good = api.post(
        path,
        {"ttl_s": 60},
        **{"Lease-Token": str(task["lease"]["token"]), "Idempotency-Key": "renew-1"},
    )
    assert good.status_code == 200
    forged = api.post(
        path, {"ttl_s": 60}, **{"Lease-Token": "999", "Idempotency-Key": "renew-1"}
    )
    assert forged.status_code == 422
    assert forged.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"
