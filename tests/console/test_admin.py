"""The platform operator (a superuser) opens every page of every tenant; events stay
unchangeable even for them. Tenant members are tried in the other files here
(test_admin_matrix.py walks every page as every role)."""

from __future__ import annotations

import base64

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from audit import services as audit_services
from audit.models import Event
from portal.actors import Actor
from tests.support.new_keys import form_token

pytestmark = pytest.mark.django_db

PAGES = [
    "portal/tenant",
    "portal/agent",
    "portal/membership",
    "tasks/task",
    "tasks/operation",
    "tasks/contract",
    "tasks/credential",
    "tasks/objectversion",
    "audit/event",
    "audit/outbox",
    "tasks/connector",
    "tasks/escalation",
    "tasks/approval",
]


@pytest.fixture
def staff_client(client):
    user = User.objects.create_superuser(
        "root", "root@example.com", "pw-for-tests-only"
    )
    client.force_login(user)
    return client


@pytest.mark.parametrize("page", PAGES)
def test_every_model_has_a_list_page(staff_client, make_operation, page):
    make_operation()
    assert staff_client.get(f"/admin/{page}/").status_code == 200


def test_an_event_cannot_be_changed_or_deleted_from_the_admin(staff_client, tenant):
    with transaction.atomic():
        event_id = audit_services.event_append(
            tenant_id=tenant.pk, code="task.registered", actor=Actor.system("t")
        )
    page = staff_client.get(f"/admin/audit/event/{event_id}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert (
        staff_client.post(f"/admin/audit/event/{event_id}/delete/").status_code == 403
    )
    assert staff_client.get("/admin/audit/event/add/").status_code == 403
    assert Event.objects.filter(pk=event_id).exists()


def test_issuing_a_key_from_the_admin_shows_the_secret_once(staff_client, agent):
    response = staff_client.post(
        "/admin/portal/agent/",
        {
            "action": "issue_key",
            "_selected_action": [str(agent.pk)],
            "once": form_token(staff_client, "/admin/portal/agent/"),
        },
        follow=True,
    )
    text = response.content.decode()
    assert "not shown again" in text and "agp_" in text
    key = agent.keys.get()
    assert key.key_hash not in text


def test_a_connector_private_key_is_never_shown_its_public_key_is(staff_client, tenant):
    from tasks import services as task_services
    from tasks.credentials import public_pem
    from tasks.sealed import connector_key_unseal

    connector = task_services.connector_save(
        tenant=tenant, target="desk", values={"base_url": "https://desk-9.example/"}
    )
    private_key = connector_key_unseal(
        tenant_id=tenant.pk,
        connector_id=connector.pk,
        sealed=connector.sealed_private_key,
    )
    page = staff_client.get(f"/admin/tasks/connector/{connector.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    for spelling in (
        private_key.hex(),
        base64.b64encode(private_key).decode(),
        base64.urlsafe_b64encode(private_key).decode().rstrip("="),
        connector.sealed_private_key,
    ):
        assert spelling not in text
    # The public key is there, to install on the target.
    assert connector.key_id in text
    assert public_pem(connector.public_key).splitlines()[1] in text


def test_a_contract_version_is_added_validated_and_published_from_the_admin(
    staff_client, tenant
):
    import json

    from tasks.models import Contract
    from tests.support.contracts import SPEC

    bad = staff_client.post(
        "/admin/tasks/contract/add/",
        {"tenant": str(tenant.pk), "key": "ci", "spec": json.dumps({"nope": 1})},
    )
    assert bad.status_code == 200  # the form again, with the problems listed
    assert b"required property" in bad.content
    assert not Contract.objects.exists()
    good = staff_client.post(
        "/admin/tasks/contract/add/",
        {"tenant": str(tenant.pk), "key": "ci", "spec": json.dumps(SPEC)},
    )
    assert good.status_code == 302
    contract = Contract.objects.get()
    assert (contract.version, contract.status) == (1, "draft")
    staff_client.post(
        "/admin/tasks/contract/",
        {"action": "publish_versions", "_selected_action": [str(contract.pk)]},
    )
    contract.refresh_from_db()
    assert contract.status == "published"
    assert (
        staff_client.get(f"/admin/tasks/contract/{contract.pk}/change/").status_code
        == 200
    )
