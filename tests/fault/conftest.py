"""Fixtures of the fault tier: a seeded world, a real ticket desk, real workers.

The workers are separate processes, so the world is committed (``transactional_db``)
and they connect to the *test* database. Each test has its own Celery queue on the
machine's RabbitMQ, so nothing else consumes its messages; the queue is deleted
afterwards.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from portal import services as portal_services
from portal.actors import Actor
from portal.db import db_now
from portal.models import Agent, Tenant
from tasks import gateway
from tasks import services as task_services
from tasks.gateway import execute as gateway_execute
from tasks.models import Connector
from tests.support import broker
from tests.support.connectors import desk_connector
from tests.support.contracts import TARGET, customer_issue_spec
from ticketdesk.harness import TicketDesk

from .harness import (
    WorkerPool,
    database_url,
    queue_declare,
    queue_delete,
)

# How long a call may be in flight before recovery treats it as in doubt: short, so
# a run killed mid-call is settled in seconds. Workers and this process agree on it.
EXECUTION_DEADLINE_S = 3
# The queued grace stamped by this process (the workers keep the real 30 s).
QUEUED_GRACE_S = 3600
# The lease the agent holds on each task: longer than any run of this tier.
LEASE_S = 3600
# Generous ages: a 10,000-operation run waits long in the queue, and a stale field is
# a refusal (tested elsewhere), not what this tier is about.
SPEC = customer_issue_spec(max_age_s=86400)


amqp_url = broker.amqp_url  # the shared fixture (tests/support/broker.py)


@pytest.fixture
def chaos_queue(amqp_url: str) -> Iterator[str]:
    """A Celery queue of this test only (declared now, deleted afterwards)."""
    name = f"chaos-{uuid.uuid4().hex[:12]}"
    queue_declare(amqp_url, name)
    yield name
    queue_delete(amqp_url, name)


@dataclass
class Planned:
    """One operation of the run: reserved under a leased, running task."""

    operation_id: uuid.UUID
    key: str
    lease_token: int
    submitted_at: float | None = None  # time.time() once queued and published


@dataclass
class World:
    tenant: Tenant
    agent: Agent
    desk: TicketDesk
    connector: Connector
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def actor(self) -> Actor:
        return Actor.of_agent(self.agent)

    def tickets(self) -> list[dict[str, Any]]:
        """The desk's tickets of this test's tenant, as the desk counts them."""
        return [t for t in self.desk.tickets() if t["tenant"] == str(self.tenant.pk)]

    def plan(self, n: int) -> Planned:
        """Register, lease (long), start and reserve: one ``create_ticket`` on a task.

        The same services an agent reaches through the API, called directly. Safe to
        call again for the same ``n`` (after a lost connection): each step resumes
        where the first call got to.
        """
        object_id = f"{self.run_id}-{n}"
        task = task_services.task_register(
            tenant=self.tenant,
            actor=self.actor,
            client_task_id=f"chaos-{object_id}",
            workflow_key="customer-issue",
            workflow_version="1",
            object_type="customer_issue",
            object_id=object_id,
            object_version="7",
            contract_key="customer-issue",
        ).task
        task_services.object_version_record(
            tenant=self.tenant,
            object_type="customer_issue",
            object_id=object_id,
            version="7",
        )
        if task.lease_owner is None:
            task = task_services.task_lease_acquire(
                tenant=self.tenant,
                task_id=task.pk,
                owner="agent",
                actor=self.actor,
                ttl_s=LEASE_S,
            )
        if task.state == "pending":
            task = task_services.task_transition(
                tenant=self.tenant,
                task_id=task.pk,
                to="running",
                expected_version=task.state_version,
                lease_token=task.lease_token,
                actor=self.actor,
            )
        key = f"chaos-ticket-{object_id}"
        reserved = task_services.operation_reserve(
            tenant=self.tenant,
            task_id=task.pk,
            lease_token=task.lease_token,
            idempotency_key=key,
            action="create_ticket",
            target=TARGET,
            input={"queue": "billing", "summary": f"Refund {n}", "customer": "ana"},
            actor=self.actor,
        )
        return Planned(
            operation_id=reserved.operation.pk, key=key, lease_token=task.lease_token
        )

    def fields(self, now: dt.datetime) -> list[gateway.FieldValue]:
        return [
            gateway.FieldValue(
                name="email", value="ana@example.com", source="crm", observed_at=now
            ),
            gateway.FieldValue(
                name="plan", value="pro", source="billing", observed_at=now
            ),
        ]

    def queue_execution(self, planned: Planned, *, again: bool = False) -> None:
        """Every check runs and commits now; a worker makes the call later.

        ``again``: a retry after a lost connection, whose first try may have
        committed; queueing a still-reserved operation again is harmless.
        """
        result = gateway.operation_execute(
            tenant=self.tenant,
            operation_id=planned.operation_id,
            lease_token=planned.lease_token,
            fields=self.fields(db_now()),
            actor=self.actor,
            queue=True,
        )
        assert again or result.outcome == "queued", (result.outcome, result.reason)


@pytest.fixture
def world(
    transactional_db: None,
    desk: TicketDesk,
    tenant: Tenant,
    make_agent: Callable[..., Agent],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> World:
    """A published contract, a connector to the desk and an agent with a grant.

    This process settles what the workers leave in doubt, so it uses the workers'
    execution deadline. It also queues every execution, and the queued grace is
    stamped then (``next_check_at``): lengthened here so that the settle loop, which
    is never killed, does not start operations whose messages merely wait behind a
    bulk submission (most of 1,000 wait longer than the real 30 s). The loop ends
    the grace itself once the queue is empty (``harness.make_due``).
    """
    settings.PORTAL_EXECUTION_DEADLINE_S = EXECUTION_DEADLINE_S
    monkeypatch.setattr(gateway_execute, "QUEUED_GRACE_S", QUEUED_GRACE_S)
    task_services.contract_create(
        tenant=tenant, key="customer-issue", spec=SPEC, publish=True
    )
    connector = desk_connector(
        tenant=tenant,
        desk=desk,
        target=TARGET,
        read_timeout_s=5.0,
        connect_timeout_s=2.0,
    )
    agent = make_agent(tenant=tenant, grants=())
    portal_services.agent_grant(agent=agent, action="create_ticket", target=TARGET)
    return World(tenant=tenant, agent=agent, desk=desk, connector=connector)


@pytest.fixture
def make_workers(
    world: World, chaos_queue: str, amqp_url: str, tmp_path: Path
) -> Iterator[Callable[[int], WorkerPool]]:
    """Start N worker nodes on this test's queue; all stopped, no process left."""
    pools: list[WorkerPool] = []
    env = dict(os.environ)
    env.update(
        CELERY_BROKER_URL=amqp_url,
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="config.settings",
        PORTAL_EXECUTION_DEADLINE_S=str(EXECUTION_DEADLINE_S),
        PORTAL_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )

    def make(count: int) -> WorkerPool:
        pool = WorkerPool(count=count, queue=chaos_queue, env=env, log_dir=tmp_path)
        pools.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in pools:
            pool.stop()
