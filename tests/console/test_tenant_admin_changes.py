"""A tenant admin's changes, made through the admin pages: each is one event naming
the person, secrets never reach the trail, and other roles and tenants are refused."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from audit.models import Event
from console import services
from console.exceptions import LastAdministrator
from portal.exceptions import PermissionDenied, TenantNotVisible
from portal.models import Agent, AgentGrant, AgentKey, Membership, Role, Tenant
from portal.roles import perms_of
from tasks.models import Connector, Contract
from tests.support.contracts import SPEC
from tests.support.new_keys import form_token, shown_secret
from tests.support.tenancy import tenant_fingerprint

from .conftest import Cast

pytestmark = pytest.mark.django_db


def _new_events(cast: Cast, since: set) -> list[Event]:
    return list(
        Event.objects.filter(tenant=cast.a).exclude(pk__in=since).order_by("id")
    )


def _event_ids(cast: Cast) -> set:
    return set(Event.objects.filter(tenant=cast.a).values_list("pk", flat=True))


def _one_event_by(cast: Cast, since: set, code: str) -> Event:
    events = _new_events(cast, since)
    assert [e.code for e in events] == [code]
    admin = cast.people["admin_a"].user
    assert (events[0].actor_type, events[0].actor_id) == ("user", str(admin.pk))
    return events[0]


def test_an_admin_adds_a_member_changes_the_role_and_removes_them(cast: Cast):
    client = cast.client("admin_a")
    newcomer = User.objects.create_user(username="newcomer", is_staff=True)
    before = _event_ids(cast)

    response = client.post(
        "/admin/portal/membership/add/",
        {"tenant": str(cast.a.pk), "username": "newcomer", "role": "reviewer"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    event = _one_event_by(cast, before, "membership.granted")
    assert event.payload["role"] == "reviewer"
    assert perms_of(user=newcomer, tenant=cast.a) == {"view_trail", "export_trail"}

    membership = Membership.objects.get(tenant=cast.a, user=newcomer)
    before = _event_ids(cast)
    client.post(
        f"/admin/portal/membership/{membership.pk}/change/", {"role": "support"}
    )
    event = _one_event_by(cast, before, "membership.granted")
    assert (event.payload["previous_role"], event.payload["role"]) == (
        "reviewer",
        "support",
    )
    newcomer = User.objects.get(pk=newcomer.pk)  # a fresh permission cache
    assert perms_of(user=newcomer, tenant=cast.a) == {"view_trail", "work_takeover"}

    before = _event_ids(cast)
    client.post(
        "/admin/portal/membership/",
        {"action": "remove_members", "_selected_action": [str(membership.pk)]},
    )
    _one_event_by(cast, before, "membership.revoked")
    newcomer = User.objects.get(pk=newcomer.pk)
    assert perms_of(user=newcomer, tenant=cast.a) == set()


def test_an_admin_issues_and_revokes_a_key_and_the_secret_stays_out(cast: Cast):
    client = cast.client("admin_a")
    agent = services.agent_create(
        tenant=cast.a, by=cast.people["admin_a"].user, name="bot"
    )
    before = _event_ids(cast)
    page = client.post(
        "/admin/portal/agent/",
        {
            "action": "issue_key",
            "_selected_action": [str(agent.pk)],
            "once": form_token(client, "/admin/portal/agent/"),
        },
        follow=True,
    )
    secret = shown_secret(page)
    event = _one_event_by(cast, before, "agent_key.issued")
    assert secret.split(".")[0] == event.payload["key_prefix"]
    assert secret not in json.dumps(event.payload)

    key = AgentKey.objects.get(agent=agent)
    before = _event_ids(cast)
    client.post(
        "/admin/portal/agentkey/",
        {"action": "revoke_keys", "_selected_action": [str(key.pk)]},
    )
    _one_event_by(cast, before, "agent_key.revoked")
    assert AgentKey.objects.get(pk=key.pk).revoked_at is not None


def test_an_admin_grants_and_revokes(cast: Cast):
    client = cast.client("admin_a")
    agent = Agent.objects.create(tenant=cast.a, name="granted-bot")
    before = _event_ids(cast)
    response = client.post(
        "/admin/portal/agentgrant/add/",
        {"agent": str(agent.pk), "action": "create_ticket", "target": "desk"},
    )
    assert response.status_code == 302
    _one_event_by(cast, before, "agent_grant.added")
    grant = AgentGrant.objects.get(agent=agent)
    before = _event_ids(cast)
    client.post(
        "/admin/portal/agentgrant/",
        {"action": "revoke_grants", "_selected_action": [str(grant.pk)]},
    )
    _one_event_by(cast, before, "agent_grant.revoked")
    assert not AgentGrant.objects.filter(agent=agent).exists()


def test_an_admin_publishes_and_retires_a_contract(cast: Cast):
    client = cast.client("admin_a")
    before = _event_ids(cast)
    response = client.post(
        "/admin/tasks/contract/add/",
        {"tenant": str(cast.a.pk), "key": "ci", "spec": json.dumps(SPEC)},
    )
    assert response.status_code == 302
    _one_event_by(cast, before, "contract.created")
    contract = Contract.objects.get(tenant=cast.a, key="ci")
    for action, code, status in (
        ("publish_versions", "contract.published", "published"),
        ("retire_versions", "contract.retired", "retired"),
    ):
        before = _event_ids(cast)
        client.post(
            "/admin/tasks/contract/",
            {"action": action, "_selected_action": [str(contract.pk)]},
        )
        event = _one_event_by(cast, before, code)
        assert event.contract_key == "ci" and event.contract_version == 1
        contract.refresh_from_db()
        assert contract.status == status


def test_a_connector_change_is_audited_without_its_signing_key(cast: Cast):
    """The admin types no key: the portal makes the pair, keeps it on a change
    and replaces it on "rotate"; the trail says so, with no key material."""
    client = cast.client("admin_a")
    form = {
        "tenant": str(cast.a.pk),
        "target": "desk",
        "base_url": "https://desk-9.example/",
        "execute_path": "/tickets",
        "lookup_path": "/tickets",
        "reference_field": "ticket_id",
        "supports_idempotency_keys": "on",
        "supports_lookup": "on",
        "connect_timeout_s": "2",
        "read_timeout_s": "5",
        "max_attempts": "3",
    }
    before = _event_ids(cast)
    assert client.post("/admin/tasks/connector/add/", form).status_code == 302
    _one_event_by(cast, before, "connector.created")
    connector = Connector.objects.get(tenant=cast.a, target="desk")
    first = (connector.key_id, connector.sealed_private_key)

    before = _event_ids(cast)
    changed = {**form, "base_url": "https://desk-10.example/"}
    client.post(f"/admin/tasks/connector/{connector.pk}/change/", changed)
    event = _one_event_by(cast, before, "connector.changed")
    assert event.payload["changed"] == {
        "base_url": ["https://desk-9.example/", "https://desk-10.example/"]
    }
    assert event.payload["signing_key_replaced"] is False
    connector.refresh_from_db()
    assert (connector.key_id, connector.sealed_private_key) == first  # kept

    before = _event_ids(cast)
    client.post(
        f"/admin/tasks/connector/{connector.pk}/change/",
        {**changed, "rotate_key": "on"},
    )
    event = _one_event_by(cast, before, "connector.changed")
    connector.refresh_from_db()
    assert event.payload["signing_key_replaced"] is True
    assert connector.key_id != first[0]
    page = client.get(f"/admin/tasks/connector/{connector.pk}/change/").content
    assert connector.key_id.encode() in page
    trail = json.dumps(list(Event.objects.values_list("payload", flat=True)))
    for sealed in (first[1], connector.sealed_private_key):
        assert sealed not in trail and sealed.encode() not in page


def test_an_admin_changes_the_tenant_settings(cast: Cast):
    client = cast.client("admin_a")
    before = _event_ids(cast)
    client.post(
        f"/admin/portal/tenant/{cast.a.pk}/change/",
        {"name": "Renamed", "events_on_delete": "purge"},
    )
    event = _one_event_by(cast, before, "tenant.changed")
    assert event.payload["changed"] == {"name": [cast.a.name, "Renamed"]}
    # the deletion policy is the operator's to change (docs/tenant-deletion.md)
    assert Tenant.objects.get(pk=cast.a.pk).events_on_delete == "keep"


@pytest.mark.parametrize("persona", ["reviewer_a", "support_a", "member_of_b_only"])
def test_others_cannot_make_these_changes_through_the_services(cast: Cast, persona):
    """The second wall: the services refuse whoever calls them without the role."""
    person = cast.people[persona].user
    agent = Agent.objects.create(tenant=cast.a, name="target-bot")
    before = tenant_fingerprint(cast.a.pk)
    error = TenantNotVisible if persona == "member_of_b_only" else PermissionDenied
    attempts = [
        lambda: services.agent_create(tenant=cast.a, by=person, name="x"),
        lambda: services.agent_key_issue(agent=agent, by=person),
        lambda: services.agent_grant_add(
            agent=agent, by=person, action="a", target="*"
        ),
        lambda: services.membership_set(
            tenant=cast.a, by=person, username=person.username, role=Role.ADMIN
        ),
        lambda: services.tenant_update(tenant=cast.a, by=person, name="x"),
    ]
    for attempt in attempts:
        with pytest.raises(error):
            attempt()
    assert tenant_fingerprint(cast.a.pk) == before


def test_the_last_administrator_cannot_be_removed_or_demoted(cast: Cast):
    admin = cast.people["admin_a"].user
    membership = Membership.objects.get(tenant=cast.a, user=admin)
    with pytest.raises(LastAdministrator):
        services.membership_revoke(membership=membership, by=admin)
    with pytest.raises(LastAdministrator):
        services.membership_set(
            tenant=cast.a, by=admin, username=admin.username, role=Role.REVIEWER
        )
    assert Membership.objects.get(pk=membership.pk).role == Role.ADMIN
