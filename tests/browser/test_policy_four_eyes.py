"""Issue 21's "done when", in Chromium, as one story (docs/policies.md, approvals.md).

A tenant administrator (not a superuser) writes "a refund above 500 needs two
approvers from finance" in the admin's policy editor, reads what it would have done
to the last week's recorded operations (the what-if), and publishes it. Then the
agent's refund of 900 waits for two distinct finance approvers: two real approver
accounts log in and approve on the approvals page, the agent's sponsor (also in
finance) is refused; meanwhile the agent's refund of 100 and its other ticket go
through. The retry under the same key runs once at the real ticket desk, and the
task's story shows both decisions. Each step's screenshot goes to docs/screenshots/.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from audit.models import Event, EventCode
from policies.models import PolicySet, PolicySetState
from portal.db import db_now
from portal.models import Role
from routing.models import Group, RoutingRule
from routing.services import group_member_add
from tasks import services as task_services
from tasks.models import Approval, Operation
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot
from tests.console.test_desk import make_person
from tests.gateway import conftest as gateway_world
from tests.gateway.conftest import World
from tests.support.contracts import SPEC

pytestmark = pytest.mark.django_db(transaction=True)

world = gateway_world.world


# What the tenant administrator types (docs/policies.md has the same text).
POLICY = """\
// Everything the grants allow, unless a rule below says otherwise.
permit(principal, action, resource);

// A refund above 500 needs two approvers from finance, not the agent's sponsor.
@id("refunds-above-500-need-two-from-finance")
@approval("finance")
@quorum("2")
@separate_from_sponsor("true")
permit(principal, action == Action::"create_ticket", resource)
when { context.amounts has amount && context.amounts.amount > 500 };
"""


def call(world: World, n: int, amount: int | None, **input: Any) -> dict[str, Any]:
    """The agent's governed call over REST (reserve, execute), the refund's amount
    among its arguments; with the answer's JSON."""
    if amount is not None:
        input["amount"] = amount
    started = world.start_task(n, input=input)
    answer = world.execute(started, world.fields())
    return {**started, "answer": answer.json()}


def retry(world: World, started: dict[str, Any]) -> dict[str, Any]:
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
    return world.execute(started, world.fields(), run["lease"]["token"]).json()


def record_last_week(world: World) -> dict[str, str]:
    """Real calls before any policy (grants alone allow them), then dated back:
    the tenant's recorded week, and one call from before it."""
    now = db_now()
    made = {
        "refund-900": (call(world, 2001, 900), 6),
        "refund-650": (call(world, 2002, 650), 3),
        "refund-120": (call(world, 2003, 120), 2),
        "other-ticket": (
            call(world, 2004, None, queue="sales", summary="Password reset"),
            1,
        ),
        "refund-800-older": (call(world, 2005, 800), 9),
    }
    ids = {}
    for name, (started, days_ago) in made.items():
        assert started["answer"]["outcome"] == "verified", started["answer"]
        ids[name] = started["operation"]["id"]
        Operation.objects.filter(pk=ids[name]).update(
            created_at=now - dt.timedelta(days=days_ago, hours=2)
        )
    return ids


def shoot(page: Any, name: str, selector: str | None = None) -> None:
    if selector is None:
        docs_shot(page, name, full_page=True)
    else:
        docs_shot(page.locator(selector), name)


def approve(page: Any, live_server: Any, username: str, shot: str | None = None) -> str:
    log_in(page, live_server, username)
    page.goto(f"{live_server.url}/admin/tasks/approval/waiting/")
    page.wait_for_selector("#approvals-waiting")
    if shot:
        shoot(page, shot)
    page.click("#approvals-waiting button[value=approve]")
    page.wait_for_selector("ul.messagelist")
    message = page.inner_text("ul.messagelist")
    page.context.clear_cookies()
    return message


def test_a_tenant_admin_writes_a_four_eyes_policy_and_finance_approves(
    page, live_server, world
):
    tenant = world.tenant
    # The refund contract names its amount and its risk (tasks/contracts.py).
    task_services.contract_create(
        tenant=tenant,
        key=world.contract.key,
        spec={**SPEC, "amount_fields": ["amount"], "risk_class": "high"},
        publish=True,
    )
    finance = Group.objects.create(tenant=tenant, name="finance")
    # Approvals wait on finance's clock: reminded after 15 min, escalated after 1 h.
    RoutingRule.objects.create(
        tenant=tenant,
        reason_code="APPROVAL_REQUIRED",
        group=finance,
        remind_after_s=900,
        escalate_after_s=3600,
    )
    admin = make_person("tia", {tenant: Role.ADMIN}, password=PASSWORD)
    assert not admin.is_superuser
    approvers = {
        name: make_person(name, {tenant: Role.SUPPORT}, password=PASSWORD)
        for name in ("ana", "ben", "sol")
    }
    for person in approvers.values():
        group_member_add(tenant=tenant, group=finance, user=person)
    world.agent.sponsor = approvers["sol"]  # sol answers for the refund agent
    world.agent.save(update_fields=["sponsor"])
    recorded = record_last_week(world)
    page.set_viewport_size({"width": 1366, "height": 800})

    # 1. The tenant administrator writes the policy in the editor.
    log_in(page, live_server, "tia")
    page.goto(f"{live_server.url}/admin/policies/policyset/add/")
    page.select_option("#id_tenant", str(tenant.pk))
    page.fill("#id_text", POLICY)
    page.fill("#id_note", "a refund above 500 needs two approvers from finance")
    shoot(page, "policy-1-editor.png")
    page.click("input[name=_continue]")
    page.wait_for_selector("#policy-what-if")

    # 2. The draft's page: it fits the schema, and what it would have done last week.
    draft = PolicySet.objects.get(tenant=tenant)
    assert draft.state == PolicySetState.DRAFT
    assert "Parses and fits" in page.inner_text("#policy-problems")
    what_if = page.inner_text("#policy-what-if")
    assert "4 operations evaluated" in what_if  # the week: not the older refund
    assert "2 would have gone differently" in what_if
    rows = page.locator("#policy-what-if-changes tbody tr")
    assert rows.count() == 2
    changed = {
        rows.nth(i).locator("a").get_attribute("href").split("/")[-3] for i in range(2)
    }
    assert changed == {recorded["refund-900"], recorded["refund-650"]}
    assert sorted(rows.nth(i).locator("td").nth(5).inner_text() for i in range(2)) == [
        "amount 650",
        "amount 900",
    ]
    for i in range(2):
        row = rows.nth(i).inner_text()
        assert "allow" in row and "approval (finance, 2)" in row
        assert "refunds-above-500-need-two-from-finance" in row
    page.locator("#policy-what-if").scroll_into_view_if_needed()
    shoot(page, "policy-2-what-if.png")

    # 3. Published from the list (the check runs again); the event names tia.
    page.goto(f"{live_server.url}/admin/policies/policyset/")
    page.check(f"input[name=_selected_action][value='{draft.pk}']")
    page.select_option("select[name=action]", "publish_versions")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    assert "published" in page.inner_text("ul.messagelist")
    shoot(page, "policy-3-published.png")
    page.context.clear_cookies()
    draft.refresh_from_db()
    assert (draft.state, draft.published_by_id) == (PolicySetState.PUBLISHED, admin.pk)
    published = Event.objects.get(tenant=tenant, code=EventCode.POLICY_SET_PUBLISHED)
    assert published.actor_id == str(admin.pk)

    # 4. The agent's calls: the refund of 900 waits; the other two go through.
    big = call(world, 3001, 900)
    assert big["answer"]["code"] == "APPROVAL_REQUIRED", big["answer"]
    small = call(world, 3002, 100)
    assert small["answer"]["outcome"] == "verified", small["answer"]
    other = call(world, 3003, None, queue="sales", summary="Password reset")
    assert other["answer"]["outcome"] == "verified", other["answer"]
    assert world.tickets() == 5 + 2  # last week's five, today's two; not the 900

    # 5. The sponsor sees why they cannot decide it; pressing Approve is refused.
    log_in(page, live_server, "sol")
    page.goto(f"{live_server.url}/admin/tasks/approval/waiting/")
    page.wait_for_selector("#approvals-waiting")
    assert "you sponsor the agent that asked" in page.inner_text(".refusal")
    sla = page.inner_text(".approval-sla")
    assert sla.startswith("finance: due in"), sla
    page.click("#approvals-waiting button[value=approve]")
    page.wait_for_selector("ul.messagelist")
    assert "Not recorded: you sponsor the agent that asked" in page.inner_text(
        "ul.messagelist"
    )
    shoot(page, "approvals-sponsor-refused.png")
    page.context.clear_cookies()

    # 6. Two distinct finance approvers.
    first = approve(page, live_server, "ana", "approvals-waiting.png")
    assert "the approval is waiting (1 of 2)" in first
    second = approve(page, live_server, "ben")
    assert "the approval is approved" in second
    approval = Approval.objects.get(operation_id=big["operation"]["id"])
    assert approval.state == "approved" and approval.quorum == 2
    assert sorted(approval.decisions.values_list("person__username", flat=True)) == [
        "ana",
        "ben",
    ]

    # 7. The agent's retry under the same key runs once.
    done = retry(world, big)
    assert done["outcome"] == "verified", done
    assert world.tickets("ticket-for-issue-3001") == 1
    assert world.tickets() == 8

    # 8. The task's story shows the approval with both decisions.
    log_in(page, live_server, "ana")
    page.goto(f"{live_server.url}/admin/tasks/task/{big['task']['id']}/change/")
    page.wait_for_selector("tr.approvals")
    story = page.inner_text("tr.approvals")
    assert "consumed" in story
    assert "ana: approve" in story and "ben: approve" in story
    shoot(page, "approvals-in-the-story.png", "tr.approvals")
