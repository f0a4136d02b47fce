"""Agent API keys expire, rotate with overlap and are revoked (issue 10 §2).

The clock is the database's (``app_now()``); tests move it with the owner's
``portal_set_clock_offset`` on the connection the test client's requests use.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from audit.models import Event
from portal import selectors
from portal import services as portal_services
from portal.db import db_now
from portal.exceptions import KeyRevoked, ValidationFailed
from portal.models import AgentKey
from tests.support.db import connect_as

from .conftest import AgentClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock() -> Iterator[object]:
    """Move the database clock forward: ``clock.move(seconds)``."""

    class Clock:
        def move(self, seconds: int) -> None:
            # The owner's definer function: no setting moves the clock.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT portal_set_clock_offset(%s::interval)",
                    [f"{seconds} seconds"],
                )

    yield Clock()
    with connection.cursor() as cursor:
        cursor.execute("SELECT portal_reset_clock_offset()")


def _get(secret: str) -> tuple[int, str | None, str]:
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    response = http.get("/api/v1/tasks")
    code = response.json().get("code") if response.status_code != 200 else None
    return response.status_code, code, response["Content-Type"]


def test_a_key_with_a_future_expiry_works_until_then(api: AgentClient, clock):
    portal_services.agent_key_revoke(key=api.agent.keys.get())
    issued = portal_services.agent_key_issue(
        agent=api.agent, expires_at=db_now() + dt.timedelta(hours=1)
    )
    assert _get(issued.secret)[0] == 200

    clock.move(3601)

    status, code, content_type = _get(issued.secret)
    assert (status, code) == (401, "API_KEY_EXPIRED")
    assert content_type == "application/problem+json"


def test_an_expired_key_is_401_problem_json_with_a_stable_code(api: AgentClient):
    key = api.agent.keys.get()
    # The cutoff arrives: set in the past by raw SQL (the service refuses that).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE portal_agentkey SET created_at = app_now() - interval '2 hours', "
            "expires_at = app_now() - interval '1 second' WHERE id = %s",
            [key.pk],
        )

    response = api.get("/api/v1/tasks")

    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "API_KEY_EXPIRED"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_key_is_401_with_its_code(api: AgentClient):
    portal_services.agent_key_revoke(key=api.agent.keys.get())

    response = api.get("/api/v1/tasks")

    assert (response.status_code, response.json()["code"]) == (401, "API_KEY_REVOKED")


def test_an_unknown_secret_with_a_real_prefix_learns_nothing(api: AgentClient):
    """Only the exact secret hears 'revoked' or 'expired'; a guess is UNAUTHENTICATED."""
    portal_services.agent_key_revoke(key=api.agent.keys.get())
    prefix = api.secret.split(".")[0]

    status, code, _ = _get(f"{prefix}.not-the-secret")

    assert (status, code) == (401, "UNAUTHENTICATED")


@pytest.mark.django_db(transaction=True)
def test_an_inactive_agent_or_a_deleted_tenant_authenticates_nothing(api: AgentClient):
    assert api.get("/api/v1/tasks").status_code == 200
    # an agent switched off, by raw SQL (the join in the key's lookup must see it)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE portal_agent SET is_active = false WHERE id = %s", [api.agent.pk]
        )
    assert _get(api.secret)[:2] == (401, "UNAUTHENTICATED")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE portal_agent SET is_active = true WHERE id = %s", [api.agent.pk]
        )
    assert _get(api.secret)[0] == 200
    # the tenant marked deleted (its events kept): the owner's column, not the app
    # role's (docs/tenant-deletion.md), so a committed tenant and the owner's UPDATE
    with connect_as("owner", autocommit=True) as owner:
        owner.execute(
            "UPDATE portal_tenant SET deleted_at = now() WHERE id = %s", [api.tenant.pk]
        )
    assert _get(api.secret)[:2] == (401, "UNAUTHENTICATED")


def test_authentication_loads_the_key_agent_and_tenant_it_checked(api: AgentClient):
    check = selectors.agent_key_authenticate(secret=api.secret)
    assert check is not None and check.status == "live"
    with CaptureQueriesContext(connection) as queries:
        agent, tenant = check.key.agent, check.key.agent.tenant
    assert (agent.pk, agent.name, tenant.pk, tenant.slug) == (
        api.agent.pk,
        api.agent.name,
        api.tenant.pk,
        api.tenant.slug,
    )
    assert check.key.prefix == api.secret.split(".")[0]
    assert len(queries) == 0  # all three came with the one statement


def test_rotation_keeps_both_keys_until_the_cutoff_then_only_the_new(
    api: AgentClient, clock
):
    old = api.agent.keys.get()
    new = portal_services.agent_key_rotate(
        key=old, old_valid_until=db_now() + dt.timedelta(minutes=10)
    )

    assert _get(api.secret)[0] == 200
    assert _get(new.secret)[0] == 200

    clock.move(601)

    assert _get(api.secret)[:2] == (401, "API_KEY_EXPIRED")
    assert _get(new.secret)[0] == 200
    new.key.refresh_from_db()
    assert new.key.expires_at is None  # the successor does not inherit the cutoff


def test_rotation_refuses_a_past_cutoff_and_a_revoked_key(api: AgentClient):
    old = api.agent.keys.get()
    with pytest.raises(ValidationFailed):
        portal_services.agent_key_rotate(
            key=old, old_valid_until=db_now() - dt.timedelta(seconds=1)
        )
    portal_services.agent_key_revoke(key=old)
    with pytest.raises(KeyRevoked):
        portal_services.agent_key_rotate(
            key=old, old_valid_until=db_now() + dt.timedelta(minutes=1)
        )
    assert AgentKey.objects.filter(agent=api.agent).count() == 1


def test_a_cutoff_only_moves_closer(api: AgentClient):
    key = api.agent.keys.get()
    soon = db_now() + dt.timedelta(minutes=5)
    with transaction.atomic():
        portal_services.agent_key_expire_write(key=key, expires_at=soon)
        later = portal_services.agent_key_expire_write(
            key=key, expires_at=soon + dt.timedelta(hours=1)
        )
    assert later.expires_at == soon


def test_the_database_refuses_an_expiry_before_the_key_existed(api: AgentClient):
    key = api.agent.keys.get()
    with (
        pytest.raises(IntegrityError) as caught,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "UPDATE portal_agentkey SET expires_at = created_at WHERE id = %s",
            [key.pk],
        )
    diag = caught.value.__cause__.diag  # type: ignore[union-attr]
    assert diag.constraint_name == "portal_agentkey_expiry_check"


# --- manage.py agent_key --------------------------------------------------------------


def _command(*args: str) -> str:
    out = io.StringIO()
    call_command("agent_key", *args, stdout=out)
    return out.getvalue()


def test_the_command_revokes_a_key_with_an_event(api: AgentClient):
    key = api.agent.keys.get()

    output = _command("revoke", key.prefix)
    again = _command("revoke", key.prefix)

    assert f"revoked {key.prefix}" in output
    assert "was revoked already" in again
    assert _get(api.secret)[:2] == (401, "API_KEY_REVOKED")
    [event] = Event.objects.filter(tenant=api.tenant, code="agent_key.revoked")
    assert (event.actor_type, event.actor_id) == ("system", "agent_key")
    assert event.payload["key_prefix"] == key.prefix


def test_the_command_rotates_with_overlap(api: AgentClient, clock):
    key = api.agent.keys.get()

    output = _command("rotate", key.prefix, "--overlap-s", "300")

    secret = output.split(": ", 1)[1].split(" ", 1)[0]
    assert api.secret not in output
    assert _get(api.secret)[0] == 200 and _get(secret)[0] == 200
    [event] = Event.objects.filter(tenant=api.tenant, code="agent_key.issued")
    assert event.payload["rotated_from"] == key.prefix
    assert secret not in str(event.payload)
    clock.move(301)
    assert _get(api.secret)[:2] == (401, "API_KEY_EXPIRED")
    assert _get(secret)[0] == 200


def test_the_command_expires_and_lists(api: AgentClient):
    key = api.agent.keys.get()
    until = (db_now() + dt.timedelta(hours=2)).isoformat()

    _command("expire", key.prefix, "--until", until)
    listed = _command("list", "--tenant", api.tenant.slug)

    key.refresh_from_db()
    assert key.expires_at == dt.datetime.fromisoformat(until)
    assert f"{key.prefix}  {api.tenant.slug}" in listed and "live until" in listed
    [event] = Event.objects.filter(tenant=api.tenant, code="agent.changed")
    assert event.payload["key_expires_at"][0] is None


@pytest.mark.parametrize(
    "args",
    [
        ("revoke", "agp_nosuchkey"),
        ("expire", "{prefix}", "--until", "2020-01-01T00:00:00+00:00"),
        ("expire", "{prefix}", "--until", "2030-01-01T00:00:00"),
    ],
    ids=["unknown-prefix", "past", "no-offset"],
)
def test_the_command_refuses_bad_input(api: AgentClient, args: tuple[str, ...]):
    key = api.agent.keys.get()
    with pytest.raises((CommandError, SystemExit)):
        _command(*(arg.format(prefix=key.prefix) for arg in args))
    key.refresh_from_db()
    assert (key.expires_at, key.revoked_at) == (None, None)
