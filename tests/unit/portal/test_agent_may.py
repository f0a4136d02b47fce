"""``agent_may``: the grant check of reservations and gateway executions."""

from __future__ import annotations

import uuid

import pytest

from portal import selectors
from portal.models import AgentGrant

pytestmark = pytest.mark.django_db


def test_a_grant_covers_its_action_on_its_target_or_any_with_a_star(
    make_tenant, make_agent
):
    tenant = make_tenant()
    agent = make_agent(tenant=tenant, grants=())
    AgentGrant.objects.create(
        tenant=tenant, agent=agent, action="create_ticket", target="ticket-desk"
    )
    AgentGrant.objects.create(tenant=tenant, agent=agent, action="refund", target="*")

    def may(action: str, target: str, agent_id: uuid.UUID | str = agent.pk) -> bool:
        return selectors.agent_may(
            tenant=tenant, agent_id=agent_id, action=action, target=target
        )

    assert may("create_ticket", "ticket-desk")
    assert may("create_ticket", "ticket-desk", agent_id=str(agent.pk))
    assert not may("create_ticket", "crm")
    assert may("refund", "anything")
    assert not may("close_ticket", "ticket-desk")
    assert not may("create_ticket", "ticket-desk", agent_id=uuid.uuid4())


def test_another_tenants_grant_does_not_count(make_tenant, make_agent):
    tenant, other = make_tenant(), make_tenant()
    agent = make_agent(tenant=tenant, grants=("create_ticket",))
    assert selectors.agent_may(
        tenant=tenant, agent_id=agent.pk, action="create_ticket", target="x"
    )
    assert not selectors.agent_may(
        tenant=other, agent_id=agent.pk, action="create_ticket", target="x"
    )


def test_a_revoked_grant_stops_covering(make_tenant, make_agent):
    tenant = make_tenant()
    agent = make_agent(tenant=tenant, grants=("create_ticket",))
    AgentGrant.objects.filter(agent=agent).delete()
    assert not selectors.agent_may(
        tenant=tenant, agent_id=agent.pk, action="create_ticket", target="x"
    )


def test_an_agent_id_that_is_no_uuid_is_refused_before_the_query(tenant):
    with pytest.raises(ValueError):
        selectors.agent_may(
            tenant=tenant, agent_id="not-a-uuid", action="create_ticket", target="x"
        )
