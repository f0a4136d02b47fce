"""Queued execution: checks now, the call on a worker; every re-run is harmless."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction

from portal import services as portal_services
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.models import Role
from tasks import escalation, takeover
from tasks.jobs import check_receipts_job, run_operation_job
from tasks.models import Operation, Task
from tests.support.db import db_clock_offset

from .conftest import World

pytestmark = pytest.mark.django_db(transaction=True)

ASYNC = {"Prefer": "respond-async"}


def queue(world: World, started: dict) -> dict:
    response = world.http.post(
        f"/api/v1/operations/{started['operation']['id']}/execute",
        json={"field_values": world.fields()},
        headers={"Lease-Token": str(started["token"]), **ASYNC},
    )
    assert response.status_code == 202, response.text
    assert response.json()["outcome"] == "queued"
    return response.json()


def run(world: World, started: dict) -> None:
    """What a worker does with the job's message (run in-process here)."""
    run_operation_job.run(
        tenant_id=str(world.tenant.pk), operation_id=started["operation"]["id"]
    )


def operation(started: dict) -> Operation:
    return Operation.objects.get(pk=started["operation"]["id"])


def test_a_queued_execution_calls_once_however_often_its_message_runs(world: World):
    started = world.start_task()
    queue(world, started)
    assert world.tickets() == 0  # the checks committed; no call yet
    assert operation(started).authorized_at is not None
    run(world, started)
    run(world, started)  # a redelivered message
    assert operation(started).state == "verified"
    assert world.tickets() == 1


def test_a_lost_message_is_run_by_the_settle_job(world: World):
    started = world.start_task()
    queue(world, started)
    with connection.cursor() as cursor:  # the grace period passes
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    assert check_receipts_job() == 1
    assert operation(started).state == "verified"
    assert world.tickets() == 1


def test_a_grant_revoked_while_queued_stops_the_call(world: World):
    started = world.start_task()
    queue(world, started)
    portal_services.agent_grant_revoke(
        agent=world.agent, action="create_ticket", target="ticket-desk"
    )
    run(world, started)
    assert (operation(started).state, operation(started).reason_code) == (
        "human_required",
        "PERMISSION_REVOKED",
    )
    assert world.tickets() == 0


def test_fields_that_grew_stale_in_the_queue_stop_the_call(world: World):
    started = world.start_task()
    queue(world, started)
    with db_clock_offset("6 minutes"):  # six minutes in the queue; email allows five
        run(world, started)
    assert operation(started).reason_code == "FIELD_STALE"
    assert world.tickets() == 0


def test_a_takeover_while_queued_means_the_run_does_nothing(world: World):
    started = world.start_task()
    queue(world, started)
    task = Task.objects.get(pk=started["task"]["id"])
    with transaction.atomic():  # escalated meanwhile, then claimed by a person
        escalation.escalate(
            tenant=world.tenant,
            task=task,
            operation=None,
            reason=ReasonCode.VERSION_CONFLICT,
            evidence={},
            actor=Actor.system("test"),
        )
    person = User.objects.create_user("sam", password="pw-for-tests-only-1")
    portal_services.membership_grant(
        tenant=world.tenant, user=person, role=Role.SUPPORT
    )
    takeover.task_human_claim(task=Task.objects.get(pk=task.pk), user=person)
    run(world, started)
    assert operation(started).state == "reserved"  # the person decides now
    assert world.tickets() == 0
