"""The agent API end to end through Django's stack: statuses, bodies, codes."""

from __future__ import annotations

import pytest

from audit.models import Event
from tasks.models import Operation, Task

from .conftest import REGISTRATION, register_and_claim

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


def lease(task: dict) -> dict[str, str]:
    return {"Lease-Token": str(task["lease"]["token"])}


def test_register_creates_then_returns_the_same_task(api):
    created = api.post("/api/v1/tasks", REGISTRATION)
    assert created.status_code == 201
    body = created.json()
    assert body["state"] == "pending"
    assert body["object"] == {"type": "customer_issue", "id": "1042", "version": "7"}
    again = api.post("/api/v1/tasks", REGISTRATION)
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]


def test_register_with_other_details_is_refused_with_422(api):
    api.post("/api/v1/tasks", REGISTRATION)
    response = api.post("/api/v1/tasks", {**REGISTRATION, "object_version": "8"})
    assert response.status_code == 422
    assert response["Content-Type"] == PROBLEM
    assert response.json()["code"] == "IDEMPOTENCY_KEY_REUSED"


def test_validation_errors_name_the_fields(api):
    response = api.post("/api/v1/tasks", {"client_task_id": ""})
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "VALIDATION_FAILED"
    assert {"client_task_id", "workflow_key", "object_type"} <= set(body["errors"])
    assert not Task.objects.exists()


def test_malformed_json_is_a_400_problem(api):
    response = api.http.post(
        "/api/v1/tasks", "{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "MALFORMED_REQUEST"


def test_a_non_json_body_is_a_415_problem(api):
    response = api.http.post("/api/v1/tasks", "a=b", content_type="text/plain")
    assert response.status_code == 415
    assert response.json()["code"] == "UNSUPPORTED_MEDIA_TYPE"


def test_unknown_api_paths_are_404_problems(api):
    response = api.get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert response["Content-Type"] == PROBLEM
    assert response.json()["code"] == "NOT_FOUND"


@pytest.mark.parametrize(
    "authorization", [None, "Bearer", "Basic abc", "Bearer agp_000000000000.nope"]
)
def test_missing_or_bad_keys_are_401(api, authorization):
    api.http.credentials(
        **({"HTTP_AUTHORIZATION": authorization} if authorization else {})
    )
    response = api.get("/api/v1/tasks")
    assert response.status_code == 401
    assert response.json()["code"] == "UNAUTHENTICATED"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_key_is_401(api):
    from portal import services as portal_services

    portal_services.agent_key_revoke(key=api.agent.keys.get())
    assert api.get("/api/v1/tasks").status_code == 401


def test_the_whole_lifecycle(api):
    task = register_and_claim(api)
    assert task["state"] == "running"
    reserved = api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {
            "idempotency_key": "ticket-1042",
            "action": "create_ticket",
            "target": "desk",
            "input": {"queue": "billing"},
        },
        **lease(task),
    )
    assert reserved.status_code == 201
    operation = reserved.json()
    replay = api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {
            "idempotency_key": "ticket-1042",
            "action": "create_ticket",
            "target": "desk",
            "input": {"queue": "billing"},
        },
        **lease(task),
    )
    assert replay.status_code == 200
    assert replay.json()["id"] == operation["id"]
    started = api.post(f"/api/v1/operations/{operation['id']}/start", **lease(task))
    assert started.json()["state"] == "executing"
    verified = api.post(
        f"/api/v1/operations/{operation['id']}/outcome",
        {"outcome": "verified", "provider_reference": "TCK-1"},
        **lease(task),
    )
    assert verified.json()["state"] == "verified"
    done = api.post(
        f"/api/v1/tasks/{task['id']}/transitions",
        {
            "to": "succeeded",
            "expected_state_version": task["state_version"],
            "payload": {"ticket": "TCK-1"},
        },
        **lease(task),
    )
    assert done.status_code == 200
    assert done.json()["state"] == "succeeded"
    events = api.get(f"/api/v1/tasks/{task['id']}/events").json()["results"]
    assert [e["code"] for e in events] == [
        "task.registered",
        "task.lease_acquired",
        "task.transitioned",
        "operation.reserved",
        "operation.executing",
        "operation.verified",
        "task.transitioned",
    ]
    newest = api.get(f"/api/v1/tasks/{task['id']}/events?order=newest").json()
    assert newest["results"][0]["code"] == "task.transitioned"


def test_a_stale_version_is_409_stale_state_and_changes_nothing(api):
    task = register_and_claim(api)
    response = api.post(
        f"/api/v1/tasks/{task['id']}/transitions",
        {"to": "succeeded", "expected_state_version": task["state_version"] - 1},
        **lease(task),
    )
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "STALE_STATE"
    assert body["state_version"] == task["state_version"]
    assert Task.objects.get(pk=task["id"]).state == "running"


def test_an_old_lease_token_is_409_lease_expired(api):
    task = register_and_claim(api)
    response = api.post(
        f"/api/v1/tasks/{task['id']}/transitions",
        {"to": "succeeded", "expected_state_version": task["state_version"]},
        **{"Lease-Token": str(task["lease"]["token"] - 1)},
    )
    assert response.status_code == 409
    assert response.json()["code"] == "LEASE_EXPIRED"


@pytest.mark.parametrize("token", [None, "", "abc", "-1", "1" * 30])
def test_a_missing_or_malformed_lease_token_is_400(api, token):
    task = register_and_claim(api)
    headers = {} if token is None else {"Lease-Token": token}
    response = api.post(
        f"/api/v1/tasks/{task['id']}/transitions",
        {"to": "succeeded", "expected_state_version": task["state_version"]},
        **headers,
    )
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"


def test_an_illegal_transition_is_409(api):
    task = register_and_claim(api)
    response = api.post(
        f"/api/v1/tasks/{task['id']}/transitions",
        {"to": "human_claimed", "expected_state_version": task["state_version"]},
        **lease(task),
    )
    assert response.status_code == 409
    assert response.json()["code"] == "ILLEGAL_TRANSITION"


def test_reserving_with_another_input_is_422_and_executes_nothing(api):
    task = register_and_claim(api)
    body = {"idempotency_key": "k", "action": "create_ticket", "target": "desk"}
    api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {**body, "input": {"a": 1}},
        **lease(task),
    )
    response = api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {**body, "input": {"a": 2}},
        **lease(task),
    )
    assert response.status_code == 422
    assert response.json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert Operation.objects.get().state == "reserved"


def test_reserving_an_ungranted_action_is_403(api):
    task = register_and_claim(api)
    response = api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {
            "idempotency_key": "k",
            "action": "delete_customer",
            "target": "crm",
            "input": {},
        },
        **lease(task),
    )
    assert response.status_code == 403
    assert response.json()["code"] == "ACTION_NOT_GRANTED"
    assert not Operation.objects.exists()


def test_lease_conflicts_are_409(api, make_client):
    task = register_and_claim(api)
    rival = make_client(tenant=api.tenant)
    response = rival.post(f"/api/v1/tasks/{task['id']}/lease", {"owner": "rival"})
    assert response.status_code == 409
    assert response.json()["code"] == "LEASE_HELD"


def test_renew_and_release(api):
    task = register_and_claim(api)
    renewed = api.post(
        f"/api/v1/tasks/{task['id']}/lease/renew", {"ttl_s": 600}, **lease(task)
    )
    assert renewed.status_code == 200
    assert renewed.json()["lease"]["expires_at"] > task["lease"]["expires_at"]
    released = api.post(f"/api/v1/tasks/{task['id']}/lease/release", **lease(task))
    assert released.json()["state"] == "pending"
    assert released.json()["lease"]["owner"] is None


def test_claim_next_then_nothing_left_is_204(api):
    api.post("/api/v1/tasks", REGISTRATION)
    claimed = api.post("/api/v1/tasks/claim-next", {"owner": "w1"})
    assert claimed.status_code == 200
    assert claimed.json()["state"] == "running"
    assert api.post("/api/v1/tasks/claim-next", {"owner": "w1"}).status_code == 204


def test_list_filters_and_cursor_pagination(api):
    for n in range(5):
        api.post(
            "/api/v1/tasks",
            {**REGISTRATION, "client_task_id": f"t{n}", "object_id": str(n)},
        )
    page = api.get("/api/v1/tasks?page_size=2").json()
    seen = [t["client_task_id"] for t in page["results"]]
    while page["next"]:
        page = api.http.get(page["next"]).json()
        seen += [t["client_task_id"] for t in page["results"]]
    assert seen == ["t0", "t1", "t2", "t3", "t4"]
    filtered = api.get("/api/v1/tasks?object_id=3").json()["results"]
    assert [t["client_task_id"] for t in filtered] == ["t3"]
    assert api.get("/api/v1/tasks?state=nonsense").status_code == 400


def test_object_versions_record_and_read(api):
    path = "/api/v1/object-versions/customer_issue/1042"
    assert api.get(path).status_code == 404
    assert api.put(path, {"version": "8"}).json()["version"] == "8"
    assert api.get(path).json()["version"] == "8"


def test_traceparent_is_stored_and_answered(api):
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    response = api.post("/api/v1/tasks", REGISTRATION, traceparent=traceparent)
    body = response.json()
    assert body["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert response["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    assert Event.objects.get(task_id=body["id"]).trace_id == body["trace_id"]
    problem = api.post("/api/v1/tasks", {}, traceparent=traceparent).json()
    assert problem["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_an_invalid_traceparent_starts_a_new_trace(api):
    body = api.post("/api/v1/tasks", REGISTRATION, traceparent="garbage").json()
    assert len(body["trace_id"]) == 32
    assert body["trace_id"] != "0" * 32


def test_the_rate_limit_answers_429_with_retry_after(api, monkeypatch):
    from portal.api import AgentRateThrottle

    monkeypatch.setattr(AgentRateThrottle, "THROTTLE_RATES", {"agent": "3/min"})
    statuses = [api.get("/api/v1/tasks").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    response = api.get("/api/v1/tasks")
    assert response.json()["code"] == "RATE_LIMITED"
    assert int(response["Retry-After"]) >= 1


def test_a_key_records_when_it_was_last_used_in_its_own_lookup(api):
    """``last_used_at`` is written by the authenticating statement itself (no
    UPDATE of its own), at most once a minute, decided on the row (not per
    process), and never for a frozen agent."""
    import datetime as dt

    from django.db.models.functions import Now

    from portal.models import Agent, AgentKey

    from .test_request_queries import statements

    key = AgentKey.objects.get(agent=api.agent)
    assert key.last_used_at is None
    with statements() as seen:
        assert api.get("/api/v1/tasks").status_code == 200
    assert not [sql for sql in seen if sql.lstrip().upper().startswith("UPDATE")]
    key.refresh_from_db()
    first = key.last_used_at
    assert first is not None
    api.get("/api/v1/tasks")  # within the minute: no second write
    key.refresh_from_db()
    assert key.last_used_at == first
    # A minute on (the mark set back 61 s), the next request writes it again, in
    # this process as in any other.
    stale = first - dt.timedelta(seconds=61)
    AgentKey.objects.filter(pk=key.pk).update(last_used_at=stale)
    api.get("/api/v1/tasks")
    key.refresh_from_db()
    assert key.last_used_at is not None and key.last_used_at >= first
    # A frozen agent's request is refused and leaves the mark alone.
    AgentKey.objects.filter(pk=key.pk).update(last_used_at=None)
    Agent.objects.filter(pk=api.agent.pk).update(frozen_at=Now())
    assert api.get("/api/v1/tasks").status_code == 403
    key.refresh_from_db()
    assert key.last_used_at is None
