"""BOLA matrix: every endpoint x another tenant's ids answers exactly like a missing id.

Routes are read from ``config.urls.api_v1``, so a new endpoint is covered (or this test
fails asking for its request body). For each route and method the answer to another
tenant's id must equal the answer to a random id (status, code, detail, field names),
and the other tenant's rows must be unchanged to the byte.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import pytest
from django.utils import timezone

from config.urls import api_v1
from portal.models import Role
from tasks import services as task_services
from tasks.models import Approval, ApprovalState
from tests.support.contracts import SPEC
from tests.support.tenancy import tenant_fingerprint

from .conftest import REGISTRATION, AgentClient, register_and_claim
from .test_takeover_api import person
from .test_takeover_api import post as staff_post

pytestmark = pytest.mark.django_db

# A request body that would be valid for the caller's own object, per route + method.
BODIES: dict[tuple[str, str], Any] = {
    ("tasks/<uuid:task_id>/lease", "post"): {"owner": "intruder"},
    ("tasks/<uuid:task_id>/lease/renew", "post"): {"ttl_s": 60},
    ("tasks/<uuid:task_id>/lease/release", "post"): None,
    ("tasks/<uuid:task_id>/transitions", "post"): {
        "to": "succeeded",
        "expected_state_version": 2,
    },
    ("tasks/<uuid:task_id>/operations", "post"): {
        "idempotency_key": "intruder-key",
        "action": "create_ticket",
        "target": "desk",
        "input": {},
    },
    ("operations/<uuid:operation_id>/start", "post"): None,
    ("operations/<uuid:operation_id>/execute", "post"): {"field_values": []},
    ("operations/<uuid:operation_id>/outcome", "post"): {
        "outcome": "verified",
        "provider_reference": "forged",
    },
    # People's routes (session auth): asked by an administrator of the caller's tenant.
    ("approvals/<uuid:approval_id>/approve", "post"): {},
    ("approvals/<uuid:approval_id>/reject", "post"): {"reason": "intruder"},
}
PEOPLES_ROUTES = ("approvals/",)
# Routes without an id of another tenant in them, checked separately below.
COLLECTIONS = {
    "actions",  # the same key in another tenant: tests/api/test_actions.py
    "approvals",  # people's list: test_the_approvals_list_never_shows_another_tenant
    "contracts",
    "tasks",
    "tasks/claim-next",
    "object-versions/<str:object_type>/<str:object_id>",
}


def routes_with_ids() -> list[tuple[str, str]]:
    cases: list[tuple[str, str]] = []
    for pattern in api_v1:
        route = str(pattern.pattern)
        if route in COLLECTIONS or route.startswith(("takeover/", "tenants/")):
            continue  # routes for people: tests/api/test_takeover_api.py, test_contracts
        view = pattern.callback.view_class  # type: ignore[attr-defined]
        cases.extend(
            (route, method)
            for method in ("get", "post", "put", "delete")
            if hasattr(view, method)
        )
    return cases


@pytest.fixture
def victim(other_api: AgentClient) -> dict[str, Any]:
    """Another tenant with a leased running task, an operation waiting for an
    approval, and an object version."""
    task = register_and_claim(other_api)
    operation = other_api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {
            "idempotency_key": "victim-key",
            "action": "create_ticket",
            "target": "desk",
            "input": {"secret": "victim"},
        },
        **{"Lease-Token": str(task["lease"]["token"])},
    ).json()
    other_api.put("/api/v1/object-versions/customer_issue/1042", {"version": "9"})
    task_services.contract_create(
        tenant=other_api.tenant, key="victim-contract", spec=SPEC, publish=True
    )
    approval = Approval.objects.create(
        tenant=other_api.tenant,
        operation_id=operation["id"],
        input_hash="0" * 64,
        state=ApprovalState.WAITING,
        asked={"secret": "victim"},
        expires_at=timezone.now() + dt.timedelta(hours=1),
    )
    return {
        "task_id": task["id"],
        "operation_id": operation["id"],
        "approval_id": str(approval.pk),
        "token": task["lease"]["token"],
        "tenant": other_api.tenant,
        "key": "victim-contract",
        "version": "1",
    }


def _call(api: AgentClient, route: str, method: str, ids: dict[str, str], token: int):
    path = "/api/v1/" + re.sub(r"<\w+:(\w+)>", lambda m: ids[m[1]], route)
    headers = {"Lease-Token": str(token)}
    people = route.startswith(PEOPLES_ROUTES)
    if method == "get":
        assert not people, f"add the people's GET {route} to this test"
        return api.get(path, **headers)
    body = BODIES.get((route, method), "missing")
    assert body != "missing", (
        f"add a request body for {method.upper()} {route} to BODIES"
    )
    if people:
        # The caller's tenant's administrator, in a browser session with CSRF.
        admin = person(api.tenant, f"admin-{uuid.uuid4().hex[:8]}", Role.ADMIN)
        return staff_post(admin, path, body)
    return getattr(api, method)(path, body, **headers)


def _masked(response, ids: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = {k: v for k, v in response.json().items() if k != "trace_id"}
    own = {str(ids[name]) for name in ("task_id", "operation_id", "approval_id")}
    own.add(ids["key"])
    return response.status_code, {k: "ID" if v in own else v for k, v in body.items()}


def test_every_id_route_is_in_the_matrix():
    """Guards the matrix itself: it must see the routes this test was written for."""
    routes = {route for route, _ in routes_with_ids()}
    assert {"tasks/<uuid:task_id>", "operations/<uuid:operation_id>/outcome"} <= routes


@pytest.mark.parametrize(("route", "method"), routes_with_ids())
def test_another_tenants_id_answers_like_a_missing_one(api, victim, route, method):
    before = tenant_fingerprint(victim["tenant"].pk)
    foreign = _call(api, route, method, victim, victim["token"])
    missing_ids = {
        "task_id": str(uuid.uuid4()),
        "operation_id": str(uuid.uuid4()),
        "approval_id": str(uuid.uuid4()),
        "key": "no-such-contract",
        "version": "1",
    }
    missing = _call(api, route, method, missing_ids, victim["token"])
    assert foreign.status_code == 404, foreign.content
    assert foreign.json()["code"] == "NOT_FOUND"
    # Whole bodies equal once the caller's own ids and the per-request trace id are
    # masked: no oracle in codes, texts or fields.
    assert _masked(foreign, victim) == _masked(missing, missing_ids)
    assert tenant_fingerprint(victim["tenant"].pk) == before


def test_listing_and_claiming_never_see_another_tenant(api, victim):
    before = tenant_fingerprint(victim["tenant"].pk)
    assert api.get("/api/v1/tasks").json()["results"] == []
    api.post("/api/v1/tasks", {**REGISTRATION, "client_task_id": "mine"})
    claimed = api.post("/api/v1/tasks/claim-next", {"owner": "w"}).json()
    assert claimed["client_task_id"] == "mine"
    assert api.post("/api/v1/tasks/claim-next", {"owner": "w"}).status_code == 204
    assert [
        t["client_task_id"] for t in api.get("/api/v1/tasks").json()["results"]
    ] == ["mine"]
    assert tenant_fingerprint(victim["tenant"].pk) == before


def test_the_approvals_list_never_shows_another_tenant(api, victim):
    admin = person(api.tenant, "admin", Role.ADMIN)
    theirs = person(victim["tenant"], "their-admin", Role.ADMIN)
    before = tenant_fingerprint(victim["tenant"].pk)
    listed = admin.get("/api/v1/approvals")
    assert listed.status_code == 200, listed.content
    assert listed.json() == []
    # The victim's own administrator does see it: the row is a waiting approval.
    assert [a["id"] for a in theirs.get("/api/v1/approvals").json()] == [
        victim["approval_id"]
    ]
    assert tenant_fingerprint(victim["tenant"].pk) == before


def test_object_versions_are_per_tenant(api, victim):
    path = "/api/v1/object-versions/customer_issue/1042"
    before = tenant_fingerprint(victim["tenant"].pk)
    assert api.get(path).status_code == 404  # the victim's version stays invisible
    assert api.put(path, {"version": "1"}).json()["version"] == "1"  # own namespace
    assert tenant_fingerprint(victim["tenant"].pk) == before


def test_a_body_cannot_choose_the_tenant(api, victim):
    """Unknown members such as tenant or tenant_id are refused: the key decides."""
    from tasks.models import Task

    before = Task.objects.count()
    refused = api.post(
        "/api/v1/tasks",
        {
            **REGISTRATION,
            "tenant": str(victim["tenant"].pk),
            "tenant_id": str(victim["tenant"].pk),
        },
    )
    assert refused.status_code == 400
    assert set(refused.json()["errors"]) == {"tenant", "tenant_id"}
    assert Task.objects.count() == before
    created = api.post("/api/v1/tasks", REGISTRATION)
    assert created.status_code == 201
    assert str(Task.objects.get(pk=created.json()["id"]).tenant_id) == str(
        api.tenant.pk
    )
