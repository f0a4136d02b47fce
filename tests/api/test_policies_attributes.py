"""What a policy reads beyond the action (issue 21 §1), through the REST API against
the real ticket desk: the agent's trust tier, tags and sponsor (``principal``), the
contract's risk class (``context.risk_class``) and its declared amounts
(``context.amounts.amount``); and publishing checks a set against the schema
generated from them. A tenant admin sets tier and tags on the agent's admin page
(one ``agent.changed`` event); support and another tenant's admin cannot.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from audit.models import Event, EventCode
from console.admin.policies import published_contract_specs
from policies import services as policy_services
from policies.exceptions import PolicyInvalid
from portal import services as portal_services
from portal.models import Agent, Role, Tenant
from tasks import services as task_services
from tasks.models import Approval
from tests.api.test_actions import body as action_body
from tests.api.test_policies import PERMIT_ALL
from tests.console.test_desk import make_person
from tests.gateway import conftest as gateway_world
from tests.gateway.conftest import World
from tests.support.checks import check_entries
from tests.support.contracts import SPEC

pytestmark = pytest.mark.django_db(transaction=True)

world = gateway_world.world

REFUNDS = """
@id("big-refunds-need-finance")
@approval("finance")
@quorum("2")
permit(principal, action == Action::"create_ticket", resource)
when { context.amounts has amount && context.amounts.amount > 500 };
"""


def declare(world: World, **spec: Any) -> None:
    """A new published version of the world's contract; new tasks pin it."""
    task_services.contract_create(
        tenant=world.tenant, key=world.contract.key, spec={**SPEC, **spec}, publish=True
    )


def publish(world: World, text: str) -> None:
    """Draft and publish against the schema of the tenant's published contracts,
    as the admin does (console.admin.policies.published_contract_specs)."""
    draft = policy_services.policy_set_draft(tenant=world.tenant, text=text)
    policy_services.policy_set_publish(
        tenant=world.tenant,
        version=draft.version,
        contract_specs=published_contract_specs(tenant=world.tenant),
    )


def set_agent(world: World, **values: Any) -> None:
    Agent.objects.filter(pk=world.agent.pk).update(**values)


def reserve(world: World, n: int, **input: Any) -> dict[str, Any] | str:
    """Reserve a call; the refusal's code when the policies refuse it."""
    try:
        return world.start_task(n, input=input or None)
    except AssertionError as refused:
        for code in ("POLICY_DENIED", "POLICY_ERROR"):
            if code in str(refused):
                return code
        raise


def test_the_agents_trust_tier(world):
    publish(
        world,
        PERMIT_ALL
        + '@id("no-restricted-agents")\n'
        + 'forbid(principal, action, resource) when { principal.trust_tier == "restricted" };',
    )
    set_agent(world, trust_tier="restricted")
    assert reserve(world, 1) == "POLICY_DENIED"
    set_agent(world, trust_tier="standard")
    started = reserve(world, 2)
    assert isinstance(started, dict)
    assert world.execute(started).json()["outcome"] == "verified"


def test_the_agents_tags_and_sponsor(world):
    publish(
        world,
        'permit(principal, action, resource) when { principal.tags.contains("tickets") };\n'
        'forbid(principal, action, resource) when { principal.sponsor == "" };',
    )
    assert reserve(world, 1) == "POLICY_DENIED"  # no tag (and no sponsor)
    set_agent(world, tags=["tickets", "billing"])
    assert reserve(world, 2) == "POLICY_DENIED"  # the tag, but no sponsor
    sol = make_person("sol", {world.tenant: Role.SUPPORT})
    set_agent(world, sponsor=sol)
    started = reserve(world, 3)
    assert isinstance(started, dict)
    assert world.execute(started).json()["outcome"] == "verified"
    assert world.tickets() == 1


def test_the_contracts_risk_class(world):
    declare(world, risk_class="high")
    publish(
        world,
        PERMIT_ALL
        + '@id("high-risk-needs-a-trusted-agent")\n'
        + "forbid(principal, action, resource)\n"
        + 'when { context.risk_class == "high" && principal.trust_tier != "trusted" };',
    )
    assert reserve(world, 1) == "POLICY_DENIED"
    set_agent(world, trust_tier="trusted")
    started = reserve(world, 2)
    assert isinstance(started, dict)
    assert world.execute(started).json()["outcome"] == "verified"


def test_declared_amounts_and_only_those(world):
    declare(world, amount_fields=["amount"])
    publish(
        world,
        PERMIT_ALL
        + REFUNDS
        # An undeclared number is no amount under this contract: never a tag.
        + 'forbid(principal, action, resource) when { context.amounts.hasTag("count") };',
    )
    big = reserve(world, 1, amount=900, count=3)
    # Reserved: the undeclared count is no tag, and an @approval does not stop a
    # reservation.
    assert isinstance(big, dict)
    waiting = world.execute(big)
    assert waiting.json()["code"] == "APPROVAL_REQUIRED", waiting.text
    evidence = check_entries(big["operation"]["id"])
    [policy] = [e["policy"] for e in evidence if e["check"] == "policy"]
    assert sorted(policy["determining"]) == ["big-refunds-need-finance", "policy0"]
    small = reserve(world, 2, amount=100)
    assert isinstance(small, dict)
    assert world.execute(small).json()["outcome"] == "verified"
    assert world.tickets() == 1


def test_a_contract_without_declared_amounts_counts_every_number(world):
    publish(
        world,
        PERMIT_ALL
        + 'forbid(principal, action, resource) when { context.amounts.hasTag("count") };',
    )
    assert reserve(world, 1, count=3) == "POLICY_DENIED"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            # Declared amounts are optional attributes: a policy must ask first.
            PERMIT_ALL + "forbid(principal, action, resource)\n"
            "when { context.amounts.amount > 500 };",
            "line 2: for policy `policy1`, unable to guarantee safety of access to "
            "optional attribute",
        ),
        (
            PERMIT_ALL + "forbid(principal, action, resource)\n"
            'when { principal.trust_level == "low" };',
            "line 2: for policy `policy1`, attribute `trust_level` on entity type "
            "`Agent` not found",
        ),
        (
            PERMIT_ALL + "forbid(principal, action, resource)\n"
            "when { context.risk_class > 2 };",
            "line 2: for policy `policy1`, unexpected type",
        ),
    ],
    ids=["optional-amount", "unknown-principal-attribute", "risk-class-is-text"],
)
def test_publish_checks_the_attributes_against_the_schema(world, text, problem):
    declare(world, amount_fields=["amount"])
    draft = policy_services.policy_set_draft(tenant=world.tenant, text=text)
    contracts = [SPEC, {**SPEC, "amount_fields": ["amount"]}]
    with pytest.raises(PolicyInvalid) as refused:
        policy_services.policy_set_publish(
            tenant=world.tenant, version=draft.version, contract_specs=contracts
        )
    assert problem in str(refused.value), refused.value
    draft.refresh_from_db()
    assert draft.state == "draft"  # nothing half-published


def _change(client: Client, agent: Agent, **values: Any):
    return client.post(
        f"/admin/portal/agent/{agent.pk}/change/",
        {
            "is_active": "on",
            "sponsor": "",
            # The read-only keys inline's management form, as the page sends it.
            "keys-TOTAL_FORMS": "0",
            "keys-INITIAL_FORMS": "0",
            **values,
        },
    )


def test_a_tenant_admin_sets_tier_and_tags_in_the_admin(world):
    tenant = world.tenant
    agent = world.agent
    other = make_person("other-admin", {})
    elsewhere = Tenant.objects.create(name="elsewhere")
    portal_services.membership_grant(tenant=elsewhere, user=other, role=Role.ADMIN)
    for person in (make_person("sue", {tenant: Role.SUPPORT}), other):
        client = Client()
        client.force_login(person)
        _change(client, agent, trust_tier="trusted", tags="refunds")
        agent.refresh_from_db()
        assert (agent.trust_tier, agent.tags) == ("standard", [])

    admin = make_person("tia", {tenant: Role.ADMIN})
    client = Client()
    client.force_login(admin)
    changed = _change(client, agent, trust_tier="trusted", tags="refunds,billing")
    assert changed.status_code == 302, changed.content.decode()[:2000]
    agent.refresh_from_db()
    assert (agent.trust_tier, agent.tags) == ("trusted", ["refunds", "billing"])
    [event] = Event.objects.filter(tenant=tenant, code=EventCode.AGENT_CHANGED)
    assert event.actor_id == str(admin.pk)
    assert (event.payload["trust_tier"], event.payload["tags"]) == (
        "trusted",
        ["refunds", "billing"],
    )
    # An unknown tier is refused by the form; nothing changes, no event.
    refused = _change(client, agent, trust_tier="godlike", tags="")
    assert refused.status_code == 200
    agent.refresh_from_db()
    assert agent.trust_tier == "trusted"
    assert (
        Event.objects.filter(tenant=tenant, code=EventCode.AGENT_CHANGED).count() == 1
    )


def test_the_one_call_names_the_approval_it_waits_for(world):
    """POST /api/v1/actions: APPROVAL_REQUIRED with the desk item and the approval
    (what the MCP tools answer too: tests/mcp/test_mcp_policies.py)."""
    declare(world, amount_fields=["amount"])
    publish(world, PERMIT_ALL + REFUNDS)
    task_services.object_version_record(
        tenant=world.tenant, object_type="customer_issue", object_id="1042", version="7"
    )
    data = action_body(
        arguments={"queue": "billing", "summary": "Refund", "amount": 900}
    )
    answer = world.http.post("/api/v1/actions", json=data).json()
    assert (answer["status"], answer["reason_code"]) == ("refused", "APPROVAL_REQUIRED")
    approval = Approval.objects.get(operation_id=answer["operation_id"])
    assert answer["details"]["approval"]["approval_id"] == str(approval.pk)
    assert answer["details"]["approval"]["quorum"] == 2
    assert answer["desk_item_id"]
    assert "Do not retry with a new key" in answer["next_step"]
    again = world.http.post("/api/v1/actions", json=data).json()
    assert again["operation_id"] == answer["operation_id"]
    assert again["reason_code"] == "APPROVAL_REQUIRED"
    assert world.tickets() == 0
