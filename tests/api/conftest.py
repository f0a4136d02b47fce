from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from portal import api as portal_api
from portal import services as portal_services
from portal.models import Agent, Tenant


@dataclass
class AgentClient:
    """An API client authenticated as one agent of one tenant."""

    agent: Agent
    secret: str
    http: APIClient

    @property
    def tenant(self) -> Tenant:
        return self.agent.tenant

    def post(self, path: str, data: Any = None, **headers: str) -> Any:
        return self.http.post(path, data, format="json", headers=headers)

    def put(self, path: str, data: Any = None, **headers: str) -> Any:
        return self.http.put(path, data, format="json", headers=headers)

    def get(self, path: str, **headers: str) -> Any:
        return self.http.get(path, headers=headers)


@pytest.fixture(autouse=True)
def _fresh_throttle_counters() -> Iterator[None]:
    cache.clear()
    portal_api._blocked.clear()  # addresses blocked for failed authentications
    yield
    cache.clear()
    portal_api._blocked.clear()


@pytest.fixture
def make_client(make_agent: Callable[..., Agent]) -> Callable[..., AgentClient]:
    def make(*, tenant: Tenant, **agent_kwargs: Any) -> AgentClient:
        agent = make_agent(tenant=tenant, **agent_kwargs)
        issued = portal_services.agent_key_issue(agent=agent)
        http = APIClient()
        http.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
        return AgentClient(agent=agent, secret=issued.secret, http=http)

    return make


@pytest.fixture
def api(tenant: Tenant, make_client: Callable[..., AgentClient]) -> AgentClient:
    return make_client(tenant=tenant)


@pytest.fixture
def other_api(
    other_tenant: Tenant, make_client: Callable[..., AgentClient]
) -> AgentClient:
    return make_client(tenant=other_tenant)


REGISTRATION = {
    "client_task_id": "issue-1042",
    "workflow_key": "customer-issue",
    "workflow_version": "1",
    "object_type": "customer_issue",
    "object_id": "1042",
    "object_version": "7",
}


def register_and_claim(
    api: AgentClient, client_task_id: str = "issue-1042", ttl_s: int | None = None
) -> dict:
    """A running task leased to ``api``'s agent (for ``ttl_s``, or the default
    lease); returns its JSON."""
    created = api.post(
        "/api/v1/tasks", {**REGISTRATION, "client_task_id": client_task_id}
    )
    assert created.status_code in (200, 201), created.json()
    task_id = created.json()["id"]
    lease = (
        {"owner": "worker-1"}
        if ttl_s is None
        else {"owner": "worker-1", "ttl_s": ttl_s}
    )
    leased = api.post(f"/api/v1/tasks/{task_id}/lease", lease)
    assert leased.status_code == 200, leased.json()
    task = leased.json()
    moved = api.post(
        f"/api/v1/tasks/{task_id}/transitions",
        {"to": "running", "expected_state_version": task["state_version"]},
        **{"Lease-Token": str(task["lease"]["token"])},
    )
    assert moved.status_code == 200, moved.json()
    return moved.json()
