"""Approvals through the REST API, against the real ticket desk (issue 21 §2).

A refund above 500 needs two approvers from finance: one approval leaves it
waiting (the agent's retry is refused again), the second distinct approver makes it
approved and the agent's retry under the same key executes once at the desk. The
same person twice, the agent's sponsor, someone outside finance are refused; an
approval answers only its own operation and field values; expiry is recorded as
expired; a rejection ends it. People decide over the staff API with a session.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from audit.models import Event, EventCode
from policies import services as policy_services
from portal import services as portal_services
from portal.models import Role
from routing.models import Group
from routing.services import group_member_add
from tasks.models import Approval, ApprovalDecision, Operation, Task
from tests.gateway import conftest as gateway_world
from tests.gateway.conftest import World
from tests.support.contracts import SPEC
from tests.support.db import db_clock_offset

pytestmark = pytest.mark.django_db(transaction=True)

world = gateway_world.world

REFUNDS = """
permit(principal, action, resource);

@id("big-refunds-need-finance")
@approval("finance")
@quorum("2")
@approval_ttl_s("3600")
@separate_from_sponsor("true")
permit(principal, action == Action::"create_ticket", resource)
when { context.amounts.hasTag("amount") && context.amounts.getTag("amount") > 500 };
"""


def publish(world: World, text: str = REFUNDS) -> None:
    draft = policy_services.policy_set_draft(tenant=world.tenant, text=text)
    policy_services.policy_set_publish(
        tenant=world.tenant, version=draft.version, contract_specs=[SPEC]
    )


def with_amount(world: World, amount: int, **overrides: Any) -> list[dict[str, Any]]:
    plan = next(field for field in world.fields(**overrides) if field["name"] == "plan")
    return [*world.fields(**overrides), {**plan, "name": "amount", "value": amount}]


def person(world: World, name: str, *, finance: bool = True) -> tuple[User, APIClient]:
    user = User.objects.create_user(name, password="pw-for-tests-only-1")
    portal_services.membership_grant(tenant=world.tenant, user=user, role=Role.SUPPORT)
    if finance:
        group, _ = Group.objects.get_or_create(tenant=world.tenant, name="finance")
        group_member_add(tenant=world.tenant, group=group, user=user)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    return user, client


def decide(client: APIClient, approval: Approval, verdict: str, reason: str = ""):
    client.get("/api/v1/approvals")  # the CSRF cookie, as a browser gets it
    token = client.cookies["csrftoken"].value
    return client.post(
        f"/api/v1/approvals/{approval.pk}/{verdict}",
        {"reason": reason} if reason else {},
        format="json",
        headers={"X-CSRFToken": token},
    )


def retry(world: World, started: dict[str, Any], amount: int, **overrides: Any):
    """The agent leases its task again and executes under the same key."""
    task_id = started["task"]["id"]
    lease = world.http.post(
        f"/api/v1/tasks/{task_id}/lease", json={"owner": "w2"}
    ).json()
    run = world.http.post(
        f"/api/v1/tasks/{task_id}/transitions",
        json={"to": "running", "expected_state_version": lease["state_version"]},
        headers={"Lease-Token": str(lease["lease"]["token"])},
    ).json()
    return world.execute(
        {**started, "token": run["lease"]["token"]},
        with_amount(world, amount, **overrides),
    )


def codes(operation_id: str) -> list[str]:
    return list(
        Event.objects.filter(operation_id=operation_id, code__startswith="approval.")
        .order_by("id")
        .values_list("code", flat=True)
    )


@pytest.fixture
def refund(world: World) -> dict[str, Any]:
    """A refund of 700 that waits for finance; the agent's sponsor is ``sponsor``."""
    publish(world)
    sponsor, _ = person(world, "sponsor")
    world.agent.sponsor = sponsor
    world.agent.save(update_fields=["sponsor"])
    started = world.start_task()
    waiting = world.execute(started, with_amount(world, 700))
    assert waiting.status_code == 422, waiting.text
    assert waiting.json()["code"] == "APPROVAL_REQUIRED"
    return started


def the_approval(started: dict[str, Any]) -> Approval:
    return Approval.objects.get(
        operation_id=started["operation"]["id"], state__in=["waiting", "approved"]
    )


def test_two_distinct_finance_approvers_then_the_retry_executes_once(world, refund):
    approval = the_approval(refund)
    assert (approval.state, approval.quorum, approval.groups) == (
        "waiting",
        2,
        ["finance"],
    )
    assert approval.sponsor_excluded
    assert approval.asked["arguments"]["summary"] == "Refund for issue 1042"
    _, ana = person(world, "ana")
    _, ben = person(world, "ben")

    first = decide(ana, approval, "approve")
    assert first.status_code == 200, first.content
    assert (first.json()["state"], first.json()["approvals"]) == ("waiting", 1)
    # The same person again adds nothing: refused.
    again = decide(ana, approval, "approve")
    assert again.status_code == 409
    assert again.json()["code"] == "APPROVAL_NOT_ALLOWED"
    assert "already" in again.json()["detail"]
    # One of two: the task is still with a person; nothing reached the desk.
    assert world.desk.effects()["create_requests"] == 0

    second = decide(ben, approval, "approve")
    assert second.status_code == 200, second.content
    assert second.json()["state"] == "approved"
    # The last approver works the desk: the task went back to the agent.
    assert Task.objects.get(pk=refund["task"]["id"]).state == "pending"

    done = retry(world, refund, 700)
    assert done.json()["outcome"] == "verified", done.text
    assert world.tickets() == 1
    approval.refresh_from_db()
    assert approval.state == "consumed" and approval.used_at is not None
    assert codes(refund["operation"]["id"]) == [
        "approval.requested",
        "approval.decided",
        "approval.decided",
        "approval.approved",
        "approval.consumed",
    ]
    decided = Event.objects.filter(
        operation_id=refund["operation"]["id"], code=EventCode.APPROVAL_DECIDED
    ).first()
    assert decided is not None
    assert decided.payload["saw"]["asked"]["action"] == "create_ticket"
    assert len(decided.payload["saw_digest"]) == 64


def test_one_approval_is_not_enough_and_the_retry_is_refused(world, refund):
    approval = the_approval(refund)
    _, ana = person(world, "ana")
    assert decide(ana, approval, "approve").json()["approvals"] == 1
    _, desk_person = person(world, "dee", finance=False)
    # Someone outside finance cannot make up the quorum.
    outsider = decide(desk_person, approval, "approve")
    assert outsider.status_code == 409
    assert outsider.json()["code"] == "APPROVAL_NOT_ALLOWED"
    assert "finance" in outsider.json()["detail"]
    # A desk person hands the task back; the agent retries with one approval of two.
    task = Task.objects.get(pk=refund["task"]["id"])
    from tasks import takeover

    dee = User.objects.get(username="dee")
    takeover.task_human_claim(task=task, user=dee)
    takeover.task_human_resolve(task=task, user=dee, resolution="hand_back")
    refused = retry(world, refund, 700)
    assert refused.json()["code"] == "APPROVAL_REQUIRED", refused.text
    assert world.desk.effects()["create_requests"] == 0
    approval.refresh_from_db()
    assert approval.state == "waiting"  # the same request, still one of two


def test_the_agents_sponsor_is_refused(world, refund):
    approval = the_approval(refund)
    sponsor = APIClient(enforce_csrf_checks=True)
    sponsor.force_login(User.objects.get(username="sponsor"))
    refused = decide(sponsor, approval, "approve")
    assert refused.status_code == 409
    assert refused.json()["code"] == "APPROVAL_NOT_ALLOWED"
    assert "sponsor" in refused.json()["detail"]
    assert not ApprovalDecision.objects.filter(approval=approval).exists()


def test_an_approval_covers_only_its_own_arguments_and_field_values(world, refund):
    approval = the_approval(refund)
    _, ana = person(world, "ana")
    _, ben = person(world, "ben")
    decide(ana, approval, "approve")
    decide(ben, approval, "approve")
    # Another refund (other arguments, its own operation) is not covered.
    other = world.start_task(1043, input={"summary": "another refund"})
    refused = world.execute(other, with_amount(world, 700))
    assert refused.json()["code"] == "APPROVAL_REQUIRED", refused.text
    # The approved operation retried with other field values: not this approval.
    changed = retry(world, refund, 800)
    assert changed.json()["code"] == "APPROVAL_REQUIRED", changed.text
    approval.refresh_from_db()
    assert approval.state == "superseded"
    newer = the_approval(refund)
    assert newer.state == "waiting" and newer.pk != approval.pk
    assert world.tickets() == 0
    operation = Operation.objects.get(pk=refund["operation"]["id"])
    assert operation.state == "human_required"


def test_expiry_is_recorded_as_expired_not_rejected(world, refund):
    approval = the_approval(refund)
    _, ana = person(world, "ana")
    with db_clock_offset("2 hours"):  # past @approval_ttl_s("3600")
        late = decide(ana, approval, "approve")
    assert late.status_code == 409
    assert late.json()["code"] == "APPROVAL_EXPIRED"
    approval.refresh_from_db()
    assert approval.state == "expired"
    assert codes(refund["operation"]["id"]) == [
        "approval.requested",
        "approval.expired",
    ]
    assert not Event.objects.filter(code=EventCode.APPROVAL_REJECTED).exists()


def test_a_rejection_needs_a_reason_and_ends_it(world, refund):
    approval = the_approval(refund)
    _, ana = person(world, "ana")
    _, ben = person(world, "ben")
    no_reason = decide(ana, approval, "reject")
    assert no_reason.status_code == 400, no_reason.content
    rejected = decide(ana, approval, "reject", reason="amount above the contract")
    assert rejected.json()["state"] == "rejected"
    late = decide(ben, approval, "approve")
    assert late.status_code == 409
    assert late.json()["code"] == "APPROVAL_NOT_ALLOWED"
    assert codes(refund["operation"]["id"])[-1] == "approval.rejected"
    assert world.tickets() == 0


def test_a_small_refund_and_other_calls_go_through(world, refund):
    small = world.start_task(1044)
    assert world.execute(small, with_amount(world, 100)).json()["outcome"] == (
        "verified"
    )
    assert world.tickets() == 1
