"""A queued run of a frozen agent or tenant is refused when it starts (docs/limits.md)."""

from __future__ import annotations

import pytest

from audit.models import Event, EventCode
from limits import services as limits_services
from tasks.models import Operation, Task

from .conftest import World
from .test_queued_execution import queue, run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("what", ["agent", "tenant"])
def test_a_queued_run_is_refused_by_name_after_a_freeze(world: World, what: str):
    # given an execution the gateway authorised and queued for a worker
    started = world.start_task()
    queue(world, started)
    # when the agent (or its tenant) is frozen before the worker starts it
    if what == "agent":
        limits_services.agent_freeze(tenant=world.tenant, agent_id=world.agent.pk)
    else:
        limits_services.tenant_freeze(tenant=world.tenant)
    task = Task.objects.get(pk=started["task"]["id"])
    assert task.lease_expires_at is not None  # the freeze expired the lease
    run(world, started)
    # then the run is refused by the frozen check, nothing is called, a person decides
    reason = "AGENT_FROZEN" if what == "agent" else "TENANT_FROZEN"
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert (operation.state, operation.reason_code) == ("human_required", reason)
    assert world.tickets() == 0
    checked = Event.objects.filter(
        operation_id=operation.pk, code=EventCode.GATEWAY_CHECKED, reason_code=reason
    ).get()
    assert checked.payload["check"] == "frozen"
