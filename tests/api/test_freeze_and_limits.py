"""The kill switch and the per-agent limits through the API (docs/limits.md)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db.models.functions import Now
from rest_framework.test import APIClient

from audit.models import Event, EventCode
from limits import services as limits_services
from limits.models import Budget, RateLimit
from portal import services as portal_services
from portal.actors import Actor
from portal.exceptions import AgentFrozen
from portal.models import Agent, Role, Tenant
from tasks import services as tasks_services
from tasks.models import Operation, Task

from .conftest import AgentClient, register_and_claim

pytestmark = pytest.mark.django_db

_people = itertools.count(1)


@pytest.fixture
def make_person_client() -> Callable[[Tenant, str], APIClient]:
    """A session client of a person with ``role`` in the tenant."""

    def make(tenant: Tenant, role: str) -> APIClient:
        user = User.objects.create_user(f"{role}-{next(_people)}", is_staff=True)
        portal_services.membership_grant(tenant=tenant, user=user, role=Role(role))
        client = APIClient()
        client.force_login(user)
        return client

    return make


def _reserve(api: AgentClient, task: dict[str, Any], key: str, **input: Any) -> Any:
    return api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {"idempotency_key": key, "action": "a", "target": "desk", "input": input},
        **{"Lease-Token": str(task["lease"]["token"])},
    )


def _denials(api: AgentClient, reason: str) -> list[Event]:
    return list(
        Event.objects.filter(
            tenant=api.tenant, code=EventCode.GATEWAY_CHECKED, reason_code=reason
        )
    )


def test_a_frozen_agent_is_refused_with_403_and_each_refusal_is_an_event(api):
    # given an agent with a running task under its lease
    task = register_and_claim(api)
    admin = User.objects.create_superuser("boss")
    # when a person freezes it
    limits_services.agent_freeze(tenant=api.tenant, agent_id=api.agent.pk, by=admin)
    # then every call is refused as AGENT_FROZEN (the key is valid: 403, not 401)
    for response in (api.get("/api/v1/tasks"), _reserve(api, task, "k-1")):
        assert response.status_code == 403
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "AGENT_FROZEN"
    # and each refusal is a denial event naming the agent
    denials = _denials(api, "AGENT_FROZEN")
    assert len(denials) == 2
    assert {d.actor_id for d in denials} == {str(api.agent.pk)}
    assert {d.payload["phase"] for d in denials} == {"api"}
    # and the lease it held is expired, in the freeze's one event naming the person
    assert Task.objects.get(pk=task["id"]).lease_expires_at is not None
    frozen = Event.objects.get(
        tenant=api.tenant, code=EventCode.AGENT_CHANGED, reason_code="AGENT_FROZEN"
    )
    assert frozen.actor_type == "user" and frozen.actor_id == str(admin.pk)
    assert frozen.payload["revoked_leases"] == 1
    assert frozen.payload["revoked_lease_task_ids"] == [task["id"]]


def test_unfreezing_lets_the_agent_call_again_and_is_audited(api):
    admin = User.objects.create_superuser("boss")
    limits_services.agent_freeze(tenant=api.tenant, agent_id=api.agent.pk, by=admin)
    assert api.get("/api/v1/tasks").status_code == 403
    limits_services.agent_freeze(
        tenant=api.tenant, agent_id=api.agent.pk, by=admin, frozen=False
    )
    assert api.get("/api/v1/tasks").status_code == 200
    changes = Event.objects.filter(tenant=api.tenant, code=EventCode.AGENT_CHANGED)
    assert [e.payload["frozen"] for e in changes.order_by("id")] == [True, False]


def test_a_frozen_tenant_refuses_every_agent_of_it_and_no_other(api, other_api):
    limits_services.tenant_freeze(tenant=api.tenant)
    response = api.get("/api/v1/tasks")
    assert response.status_code == 403
    assert response.json()["code"] == "TENANT_FROZEN"
    assert other_api.get("/api/v1/tasks").status_code == 200
    assert len(_denials(api, "TENANT_FROZEN")) == 1


def test_a_rate_limit_refuses_the_call_past_the_window_with_429(api):
    # given a limit of two reservations of "a" per minute on any target
    RateLimit.objects.create(
        tenant=api.tenant, agent=api.agent, action="a", max_calls=2, window_s=60
    )
    task = register_and_claim(api)
    assert _reserve(api, task, "k-1").status_code == 201
    # a replay of the same key is not a new reservation: it spends nothing
    assert _reserve(api, task, "k-1").status_code == 200
    assert _reserve(api, task, "k-2").status_code == 201
    # when a third new reservation comes in the same window
    refused = _reserve(api, task, "k-3")
    # then it is refused with the window's end, and audited
    assert refused.status_code == 429
    assert refused.json()["code"] == "RATE_LIMITED"
    assert 1 <= int(refused["Retry-After"]) <= 61
    assert refused.json()["retry_after_s"] == int(refused["Retry-After"])
    (denial,) = _denials(api, "RATE_LIMITED")
    assert denial.payload["phase"] == "reserve"
    assert denial.task_id is not None
    # and nothing was reserved under the refused key
    assert _reserve(api, task, "k-3").status_code == 429


def test_a_budget_refuses_the_amount_that_would_overspend_it(api):
    Budget.objects.create(
        tenant=api.tenant, agent=api.agent, action="a", argument="amount",
        max_total=100,
    )  # fmt: skip
    task = register_and_claim(api)
    assert _reserve(api, task, "r-1", amount=60).status_code == 201
    refused = _reserve(api, task, "r-2", amount=41)
    assert refused.status_code == 422
    assert refused.json()["code"] == "BUDGET_EXCEEDED"
    assert refused.json()["used"] == "60.0000"
    assert _reserve(api, task, "r-3", amount=40).status_code == 201
    # an input without the amount is refused too: the budget fails closed
    missing = _reserve(api, task, "r-4", note="no amount")
    assert missing.status_code == 422
    assert missing.json()["argument"] == "amount"
    assert len(_denials(api, "BUDGET_EXCEEDED")) == 2


def test_the_staff_api_freezes_for_a_tenant_admin_only(api, make_person_client):
    admin = make_person_client(api.tenant, "admin")
    reviewer = make_person_client(api.tenant, "reviewer")
    url = f"/api/v1/tenants/{api.tenant.slug}/agents/{api.agent.pk}/freeze"
    refused = reviewer.post(url)
    assert refused.status_code == 404  # the reviewer cannot manage the tenant
    assert api.get("/api/v1/tasks").status_code == 200
    frozen = admin.post(url)
    assert frozen.status_code == 200
    assert frozen.json()["frozen"] is True
    assert api.get("/api/v1/tasks").json()["code"] == "AGENT_FROZEN"
    unfrozen = admin.post(url.replace("/freeze", "/unfreeze"))
    assert unfrozen.json() == {**unfrozen.json(), "frozen": False, "frozen_at": None}
    assert api.get("/api/v1/tasks").status_code == 200
    tenant_url = f"/api/v1/tenants/{api.tenant.slug}/freeze"
    assert admin.post(tenant_url).json()["frozen"] is True
    assert api.get("/api/v1/tasks").json()["code"] == "TENANT_FROZEN"


def test_manage_py_freeze_and_unfreeze(api):
    out = StringIO()
    call_command("freeze", tenant=api.tenant.slug, agent=api.agent.name, stdout=out)
    assert "frozen" in out.getvalue()
    assert api.get("/api/v1/tasks").json()["code"] == "AGENT_FROZEN"
    call_command(
        "freeze", tenant=api.tenant.slug, agent=str(api.agent.pk), unfreeze=True,
        stdout=out,
    )  # fmt: skip
    assert api.get("/api/v1/tasks").status_code == 200
    event = Event.objects.filter(
        tenant=api.tenant, code=EventCode.AGENT_CHANGED
    ).first()
    assert event is not None and (event.actor_type, event.actor_id) == (
        "system",
        "freeze",
    )


def test_the_services_refuse_a_frozen_agent_without_the_api(api):
    """What the MCP server reaches: register, lease, claim, reserve."""
    task = register_and_claim(api)
    actor = Actor.of_agent(api.agent)
    # the flag alone (a freeze would also expire the lease the reservation needs)
    Agent.objects.filter(pk=api.agent.pk).update(frozen_at=Now())
    with pytest.raises(AgentFrozen):
        tasks_services.operation_reserve(
            tenant=api.tenant, task_id=task["id"], lease_token=task["lease"]["token"],
            idempotency_key="k-9", action="a", target="desk", input={}, actor=actor,
        )  # fmt: skip
    with pytest.raises(AgentFrozen):
        tasks_services.task_lease_acquire(
            tenant=api.tenant, task_id=task["id"], owner="w", actor=actor
        )
    with pytest.raises(AgentFrozen):
        tasks_services.task_claim_next(tenant=api.tenant, owner="w", actor=actor)
    with pytest.raises(AgentFrozen):
        tasks_services.task_register(
            tenant=api.tenant, actor=actor, client_task_id="t-9", workflow_key="w",
            workflow_version="1", object_type="o", object_id="9", object_version="1",
        )  # fmt: skip
    phases = sorted(d.payload["phase"] for d in _denials(api, "AGENT_FROZEN"))
    assert phases == ["lease", "lease", "register", "reserve"]
    assert not Operation.objects.filter(tenant=api.tenant, idempotency_key="k-9")
