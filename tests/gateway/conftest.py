"""A whole world for gateway tests: a published contract, a connector to a real
ticket desk on 127.0.0.1, an agent with a grant and a key, and a live portal server
reached over real HTTP."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from portal import services as portal_services
from portal.db import db_now
from portal.models import Agent, Tenant
from tasks import services as task_services
from tasks.models import Connector, Contract
from tests.support import broker
from tests.support.connectors import desk_connector
from tests.support.contracts import SPEC, TARGET
from ticketdesk.harness import TicketDesk

# The shared broker fixtures (tests/support/broker.py): the canary test taps them.
amqp_url = broker.amqp_url
events_exchange = broker.events_exchange
celery_test_queue = broker.celery_test_queue


@dataclass
class World:
    tenant: Tenant
    agent: Agent
    http: httpx.Client
    desk: TicketDesk
    contract: Contract
    connector: Connector

    def tickets(self, key: str | None = None) -> int:
        """Tickets the desk made for this test's tenant (optionally for one key).

        Counted per tenant: a slow request of an earlier test may still complete
        after the desk was reset, and it belongs to that test's tenant.
        """
        return sum(
            1
            for ticket in self.desk.tickets()
            if ticket["tenant"] == str(self.tenant.pk)
            and (key is None or ticket["idempotency_key"] == key)
        )

    def fields(self, **overrides: Any) -> list[dict[str, Any]]:
        """Fresh, correctly sourced field values; override one to break it."""
        now = db_now()
        values = {
            "email": {
                "name": "email",
                "value": "ana@example.com",
                "source": "crm",
                "observed_at": now.isoformat(),
            },
            "plan": {
                "name": "plan",
                "value": "pro",
                "source": "billing",
                "observed_at": now.isoformat(),
            },
        }
        for name, change in overrides.items():
            if change is None:
                values.pop(name)
            else:
                values[name] = {**values[name], **change}
        return list(values.values())

    def start_task(
        self,
        n: int = 1042,
        *,
        key: str | None = None,
        input: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Register, claim and reserve: a running task with one reserved operation."""
        registered = self.http.post(
            "/api/v1/tasks",
            json={
                "client_task_id": f"issue-{n}",
                "workflow_key": "customer-issue",
                "workflow_version": "1",
                "object_type": "customer_issue",
                "object_id": str(n),
                "object_version": "7",
                "contract_key": "customer-issue",
            },
        )
        assert registered.status_code in (200, 201), registered.text
        task = registered.json()
        task_services.object_version_record(
            tenant=self.tenant,
            object_type="customer_issue",
            object_id=str(n),
            version="7",
        )
        leased = self.http.post(
            f"/api/v1/tasks/{task['id']}/lease", json={"owner": "worker-1"}
        ).json()
        token = leased["lease"]["token"]
        running = self.http.post(
            f"/api/v1/tasks/{task['id']}/transitions",
            json={"to": "running", "expected_state_version": leased["state_version"]},
            headers={"Lease-Token": str(token)},
        ).json()
        operation = self.http.post(
            f"/api/v1/tasks/{task['id']}/operations",
            json={
                "idempotency_key": key or f"ticket-for-issue-{n}",
                "action": "create_ticket",
                "target": TARGET,
                "input": {
                    "queue": "billing",
                    "summary": f"Refund for issue {n}",
                    "customer": "ana",
                    **(input or {}),
                },
            },
            headers={"Lease-Token": str(token)},
        )
        assert operation.status_code in (200, 201), operation.text
        return {"task": running, "operation": operation.json(), "token": token}

    def execute(
        self,
        started: dict[str, Any],
        fields: list[dict[str, Any]] | None = None,
        token: int | None = None,
    ) -> httpx.Response:
        return self.http.post(
            f"/api/v1/operations/{started['operation']['id']}/execute",
            json={"field_values": self.fields() if fields is None else fields},
            headers={"Lease-Token": str(started["token"] if token is None else token)},
        )


def make_world(
    *, tenant: Tenant, make_agent: Any, desk: TicketDesk, base_url: str
) -> Iterator[World]:
    """The contract, connector, agent and key, and a client of the portal at
    ``base_url`` (the live server, or a gunicorn of the test's own)."""
    contract = task_services.contract_create(
        tenant=tenant, key="customer-issue", spec=SPEC, publish=True
    )
    connector = desk_connector(
        tenant=tenant,
        desk=desk,
        target=TARGET,
        read_timeout_s=2.0,
        connect_timeout_s=1.0,
    )
    agent = make_agent(tenant=tenant, grants=())
    portal_services.agent_grant(agent=agent, action="create_ticket", target=TARGET)
    secret = portal_services.agent_key_issue(agent=agent).secret
    with httpx.Client(
        base_url=base_url,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    ) as http:
        yield World(
            tenant=tenant,
            agent=agent,
            http=http,
            desk=desk,
            contract=contract,
            connector=connector,
        )


@pytest.fixture
def world(
    transactional_db: None,
    live_server: Any,
    desk: TicketDesk,
    tenant: Tenant,
    make_agent: Any,
) -> Iterator[World]:
    yield from make_world(
        tenant=tenant, make_agent=make_agent, desk=desk, base_url=live_server.url
    )


def minutes_ago(minutes: float) -> str:
    return (db_now() - dt.timedelta(minutes=minutes)).isoformat()
