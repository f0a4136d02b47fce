"""Tenant administrators set routing up in the admin: each save is a
``tenant.changed`` event naming them; a webhook URL the outbound policy refuses is
not saved; a webhook's page shows its signing secret to administrators only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import Event, EventCode
from portal import services as portal_services
from portal.models import Role
from routing import delivery
from routing.models import Group, Webhook

pytestmark = pytest.mark.django_db


def client_of(name: str, tenant, role) -> tuple[Client, User]:
    user = User.objects.create_user(name, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=user, role=role)
    client = Client()
    client.force_login(user)
    return client, user


def test_an_admin_adds_a_group_and_the_change_names_them(tenant):
    client, ada = client_of("ada", tenant, Role.ADMIN)
    answer = client.post(
        "/admin/routing/group/add/", {"tenant": tenant.pk, "name": "Billing"}
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    group = Group.objects.get(tenant=tenant, name="Billing")
    event = Event.objects.get(tenant=tenant, code=EventCode.TENANT_CHANGED)
    assert event.actor_id == str(ada.pk)
    assert event.payload["id"] == str(group.pk)
    assert event.payload["change"] == "created"


def test_a_webhook_the_outbound_policy_refuses_is_not_saved(tenant):
    client, _ = client_of("ada", tenant, Role.ADMIN)
    answer = client.post(
        "/admin/routing/webhook/add/",
        {"tenant": tenant.pk, "url": "http://169.254.169.254/latest", "enabled": "on"},
    )
    assert answer.status_code == 200
    assert "outbound URL policy refuses it" in answer.content.decode()
    assert not Webhook.objects.filter(tenant=tenant).exists()


def test_the_webhook_secret_is_for_administrators_only(tenant):
    webhook = Webhook.objects.create(tenant=tenant, url="https://hooks.example/desk")
    secret = delivery.webhook_secret(webhook=webhook)
    admin_client, _ = client_of("ada", tenant, Role.ADMIN)
    page = admin_client.get(f"/admin/routing/webhook/{webhook.pk}/change/")
    assert secret in page.content.decode()
    for role in (Role.REVIEWER, Role.SUPPORT):
        client, _ = client_of(f"p-{role}", tenant, role)
        answer = client.get(f"/admin/routing/webhook/{webhook.pk}/change/")
        assert answer.status_code in (302, 403, 404)
        assert secret not in answer.content.decode()


def test_a_reviewer_reads_groups_but_cannot_add_one(tenant):
    Group.objects.create(tenant=tenant, name="Billing")
    client, _ = client_of("rita", tenant, Role.REVIEWER)
    assert "Billing" in client.get("/admin/routing/group/").content.decode()
    answer = client.post(
        "/admin/routing/group/add/", {"tenant": tenant.pk, "name": "Mine"}
    )
    assert answer.status_code == 403
    assert not Group.objects.filter(name="Mine").exists()
