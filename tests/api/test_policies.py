"""The policy matrix through the REST API, against the real ticket desk.

Allow, default deny, forbid wins, an ``@approval`` that makes the operation wait for
a person (and then runs once), and evaluation errors that refuse (``POLICY_ERROR``)
with nothing executed at the desk: at reserve and, when the set changed or broke
since, at execute. The world is the gateway tier's (tests/gateway/conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from audit.models import Event, EventCode
from policies import services as policy_services
from portal import services as portal_services
from portal.models import Role
from routing.models import Group
from routing.services import group_member_add
from tasks import takeover
from tasks.models import Approval, Escalation, Operation, Task
from tests.gateway import conftest as gateway_world
from tests.gateway.conftest import World
from tests.support.checks import check_entries
from tests.support.contracts import SPEC
from tests.support.db import connect_as

pytestmark = pytest.mark.django_db(transaction=True)

world = gateway_world.world

PERMIT_ALL = "permit(principal, action, resource);\n"
NOT_BILLING = """
@id("no-billing-tickets")
forbid(principal, action == Action::"create_ticket", resource)
when { context.input.hasTag("queue") && context.input.getTag("queue") == "billing" };
"""
BIG_REFUNDS = """
@id("big-refunds-need-finance")
@approval("finance")
@quorum("2")
permit(principal, action == Action::"create_ticket", resource)
when { context.amounts.hasTag("amount") && context.amounts.getTag("amount") > 500 };
"""
# Errors while evaluated (no such tag), so it cannot vouch: publish refuses it.
TRIGGER = "policies_policyset_immutable_trg"
BROKEN = """
forbid(principal, action, resource)
when { context.fields has vip && context.fields.vip == "yes" };
forbid(principal, action, resource) when { context.input.getTag("nope") == "x" };
"""


def publish(world: World, text: str) -> int:
    draft = policy_services.policy_set_draft(tenant=world.tenant, text=text)
    policy_services.policy_set_publish(
        tenant=world.tenant, version=draft.version, contract_specs=[SPEC]
    )
    return draft.version


def force_in(world: World, text: str) -> int:
    """Publish ``text`` past the publish-time check, as a corrupt row would be:
    written by the owner with the triggers off (raw SQL, not the service)."""
    version = publish(world, PERMIT_ALL)
    corrupt(world, version, text)
    return version


def corrupt(world: World, version: int, text: str) -> None:
    """The owner rewrites a published row, its trigger switched off meanwhile."""
    with connect_as("owner") as owner, owner.transaction():
        owner.execute(
            "SELECT set_config('portal.tenant_ids', %s, true)", [str(world.tenant.pk)]
        )
        owner.execute(f"ALTER TABLE policies_policyset DISABLE TRIGGER {TRIGGER}")
        owner.execute(
            "UPDATE policies_policyset SET text = %s WHERE tenant_id = %s"
            " AND version = %s",
            [text, world.tenant.pk, version],
        )
        owner.execute(f"ALTER TABLE policies_policyset ENABLE TRIGGER {TRIGGER}")


def with_amount(world: World, amount: int) -> list[dict[str, Any]]:
    """The contract's fields and an amount the agent read from billing."""
    plan = next(field for field in world.fields() if field["name"] == "plan")
    return [*world.fields(), {**plan, "name": "amount", "value": amount}]


def policy_events(operation_id: str) -> list[dict[str, Any]]:
    return [
        entry for entry in check_entries(operation_id) if entry["check"] == "policy"
    ]


def test_without_a_published_set_grants_alone_decide(world):
    started = world.start_task()
    assert world.execute(started).json()["outcome"] == "verified"
    assert policy_events(started["operation"]["id"]) == []  # the check did not apply
    assert world.tickets() == 1


def test_a_permit_allows_and_the_event_names_version_and_policy(world):
    version = publish(world, PERMIT_ALL)
    started = world.start_task()
    reserved = Event.objects.get(
        operation_id=started["operation"]["id"], code=EventCode.OPERATION_RESERVED
    )
    assert reserved.payload["policy"]["verdict"] == "allow"
    assert world.execute(started).json()["outcome"] == "verified"
    [checked] = policy_events(started["operation"]["id"])
    assert checked["verdict"] == "passed"
    assert checked["policy"]["version"] == version
    assert checked["policy"]["verdict"] == "allow"
    assert checked["policy"]["determining"] == ["policy0"]
    assert world.tickets() == 1


def test_no_matching_permit_refuses_the_reservation_and_nothing_is_stored(world):
    publish(world, 'permit(principal, action, resource in Target::"crm");')
    with pytest.raises(AssertionError, match="POLICY_DENIED"):
        world.start_task()
    assert not Operation.objects.filter(tenant=world.tenant).exists()
    assert world.desk.effects()["create_requests"] == 0


def test_forbid_wins_over_permit(world):
    publish(world, PERMIT_ALL + NOT_BILLING)
    with pytest.raises(AssertionError, match="no-billing-tickets"):
        world.start_task()  # the input's queue is "billing"
    started = world.start_task(1043, input={"queue": "sales"})
    assert world.execute(started).json()["outcome"] == "verified"
    assert world.tickets() == 1


def test_a_set_published_after_the_reservation_refuses_the_execution(world):
    started = world.start_task()  # no set yet: reserved under grants alone
    publish(world, PERMIT_ALL + NOT_BILLING)
    refused = world.execute(started)
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == "POLICY_DENIED"
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert (operation.state, operation.reason_code) == (
        "human_required",
        "POLICY_DENIED",
    )
    [checked] = policy_events(started["operation"]["id"])
    assert checked["policy"]["determining"] == ["no-billing-tickets"]
    assert world.desk.effects()["create_requests"] == 0


def test_an_approval_policy_makes_the_operation_wait_for_a_person(world):
    publish(world, PERMIT_ALL + BIG_REFUNDS)
    started = world.start_task()  # reserve passes: no amount in the arguments
    waiting = world.execute(started, with_amount(world, 900))
    assert waiting.json()["code"] == "APPROVAL_REQUIRED", waiting.text
    escalation = Escalation.objects.get(operation_id=started["operation"]["id"])
    assert escalation.evidence["policy"]["approval"] == {
        "groups": ["finance"],
        "quorum": 2,
    }
    assert world.desk.effects()["create_requests"] == 0
    # Two people of finance approve this input (quorum 2, tests/api/test_approvals
    # has the rest): one at the desk, one on the approvals page; the agent's next
    # execute uses the approval.
    finance = Group.objects.create(tenant=world.tenant, name="finance")
    sam, kim = (
        User.objects.create_user(name, password="pw-for-tests-only-1")
        for name in ("sam", "kim")
    )
    for person in (sam, kim):
        portal_services.membership_grant(
            tenant=world.tenant, user=person, role=Role.SUPPORT
        )
        group_member_add(tenant=world.tenant, group=finance, user=person)
    task = Task.objects.get(pk=started["task"]["id"])
    takeover.task_human_claim(task=task, user=sam)
    takeover.task_human_resolve(
        task=task,
        user=sam,
        resolution="approve",
        operation_id=started["operation"]["id"],
    )
    approval = Approval.objects.get(operation_id=started["operation"]["id"])
    assert approval.state == "waiting"  # one of two
    takeover.approval_decide(approval_id=approval.pk, user=kim, verdict="approve")
    lease = world.http.post(
        f"/api/v1/tasks/{task.pk}/lease", json={"owner": "w2"}
    ).json()
    run = world.http.post(
        f"/api/v1/tasks/{task.pk}/transitions",
        json={"to": "running", "expected_state_version": lease["state_version"]},
        headers={"Lease-Token": str(lease["lease"]["token"])},
    ).json()
    done = world.execute(
        {**started, "token": run["lease"]["token"]}, with_amount(world, 900)
    )
    assert done.json()["outcome"] == "verified", done.text
    assert world.tickets() == 1
    # A small refund needs nobody.
    small = world.start_task(1044)
    assert world.execute(small, with_amount(world, 20)).json()["outcome"] == "verified"


def test_an_evaluation_error_refuses_the_reservation(world):
    force_in(world, PERMIT_ALL + BROKEN)
    with pytest.raises(AssertionError, match="POLICY_ERROR"):
        world.start_task()
    assert not Operation.objects.filter(tenant=world.tenant).exists()
    assert world.desk.effects()["create_requests"] == 0


@pytest.mark.parametrize(
    "text",
    ["permit(principal, action resource);", PERMIT_ALL + BROKEN],
    ids=["does-not-parse", "errors-when-evaluated"],
)
def test_a_set_that_broke_after_the_reservation_refuses_the_execution(world, text):
    version = publish(world, PERMIT_ALL)
    started = world.start_task()
    corrupt(world, version, text)
    refused = world.execute(started)
    assert refused.json()["code"] == "POLICY_ERROR", refused.text
    [checked] = policy_events(started["operation"]["id"])
    assert checked["policy"]["verdict"] == "error" and checked["policy"]["error"]
    assert world.desk.effects()["create_requests"] == 0
