"""A tenant admin revokes, rotates and expires agent keys on the admin's API keys
page: each change is one event naming the person; reviewers, support staff and other
tenants' admins change nothing (issue 10 §2)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from audit.models import Event
from console import services
from portal import services as portal_services
from portal.db import db_now
from portal.exceptions import PermissionDenied, TenantNotVisible
from portal.models import AgentKey
from tests.support.new_keys import form_token, shown_secret
from tests.support.tenancy import tenant_fingerprint

from .conftest import Cast

pytestmark = pytest.mark.django_db

PAGE = "/admin/portal/agentkey/"


def _key(cast: Cast) -> AgentKey:
    agent = services.agent_create(
        tenant=cast.a, by=cast.people["admin_a"].user, name="rotating-bot"
    )
    return portal_services.agent_key_issue(agent=agent).key


def _events(cast: Cast, since: set) -> list[Event]:
    return list(
        Event.objects.filter(tenant=cast.a).exclude(pk__in=since).order_by("id")
    )


def _ids(cast: Cast) -> set:
    return set(Event.objects.filter(tenant=cast.a).values_list("pk", flat=True))


def _until(minutes: int = 30) -> str:
    return (db_now() + dt.timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M:%S")


def test_an_admin_rotates_a_key_with_overlap(cast: Cast):
    client = cast.client("admin_a")
    key = _key(cast)
    before = _ids(cast)
    until = _until()

    page = client.post(
        PAGE,
        {
            "action": "rotate_keys",
            "_selected_action": [str(key.pk)],
            "until": until,
            "once": form_token(client, PAGE),
        },
        follow=True,
    )

    text = page.content.decode()
    assert f"successor of {key.prefix}" in text
    secret = shown_secret(page)
    [event] = _events(cast, before)
    admin = cast.people["admin_a"].user
    assert (event.code, event.actor_type, event.actor_id) == (
        "agent_key.issued",
        "user",
        str(admin.pk),
    )
    assert event.payload["rotated_from"] == key.prefix
    assert event.payload["key_prefix"] == secret.split(".")[0]
    assert secret not in json.dumps(event.payload)
    key.refresh_from_db()
    assert key.expires_at is not None
    assert key.expires_at.strftime("%Y-%m-%d %H:%M:%S") == until
    assert key.revoked_at is None
    assert (
        AgentKey.objects.filter(agent=key.agent, revoked_at__isnull=True).count() == 2
    )


def test_an_admin_expires_a_key(cast: Cast):
    client = cast.client("admin_a")
    key = _key(cast)
    before = _ids(cast)

    client.post(
        PAGE,
        {"action": "expire_keys", "_selected_action": [str(key.pk)], "until": _until()},
    )

    [event] = _events(cast, before)
    assert event.code == "agent.changed"
    assert event.payload["key_prefix"] == key.prefix
    key.refresh_from_db()
    assert key.expires_at is not None


def test_rotate_without_a_time_changes_nothing(cast: Cast):
    client = cast.client("admin_a")
    key = _key(cast)
    before = tenant_fingerprint(cast.a.pk)

    page = client.post(
        PAGE, {"action": "rotate_keys", "_selected_action": [str(key.pk)]}, follow=True
    )

    assert "Give the time in the" in page.content.decode()
    assert tenant_fingerprint(cast.a.pk) == before


@pytest.mark.parametrize(
    "persona",
    ["reviewer_a", "support_a", "member_of_b_only", "staff_without_membership"],
)
@pytest.mark.parametrize("action", ["revoke_keys", "rotate_keys", "expire_keys"])
def test_others_cannot_change_a_key_on_the_page(cast: Cast, persona: str, action):
    key = _key(cast)
    before = tenant_fingerprint(cast.a.pk)

    response = cast.client(persona).post(
        PAGE, {"action": action, "_selected_action": [str(key.pk)], "until": _until()}
    )

    assert response.status_code in (302, 403)
    assert tenant_fingerprint(cast.a.pk) == before
    key.refresh_from_db()
    assert (key.revoked_at, key.expires_at) == (None, None)
    assert AgentKey.objects.filter(agent=key.agent).count() == 1


@pytest.mark.parametrize("persona", ["reviewer_a", "support_a", "member_of_b_only"])
def test_others_cannot_change_a_key_through_the_services(cast: Cast, persona: str):
    """The second wall: the services check the role again."""
    person = cast.people[persona].user
    key = _key(cast)
    before = tenant_fingerprint(cast.a.pk)
    error = TenantNotVisible if persona == "member_of_b_only" else PermissionDenied
    cutoff = db_now() + dt.timedelta(minutes=5)
    attempts = [
        lambda: services.agent_key_revoke(key=key, by=person),
        lambda: services.agent_key_rotate(key=key, by=person, old_valid_until=cutoff),
        lambda: services.agent_key_expire(key=key, by=person, expires_at=cutoff),
    ]
    for attempt in attempts:
        with pytest.raises(error):
            attempt()
    assert tenant_fingerprint(cast.a.pk) == before
