"""Contracts: agents read them; only a tenant's administrators change them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from audit.models import Event
from portal import services as portal_services
from portal.models import Role
from tasks.models import Contract
from tests.support.contracts import SPEC

pytestmark = pytest.mark.django_db


def person(tenant, role: Role | None) -> APIClient:
    user = User.objects.create_user(f"p-{role}-{tenant.slug}", password="pw-tests-1")
    if role is not None:
        portal_services.membership_grant(tenant=tenant, user=user, role=role)
    client = APIClient()
    client.force_login(user)
    return client


def test_an_admin_creates_publishes_and_retires_versions(tenant):
    admin = person(tenant, Role.ADMIN)
    base = f"/api/v1/tenants/{tenant.slug}/contracts"
    created = admin.post(base, {"key": "ci", "spec": SPEC}, format="json")
    assert created.status_code == 201, created.content
    assert (created.json()["version"], created.json()["status"]) == (1, "draft")
    published = admin.post(f"{base}/ci/versions/1/publish")
    assert published.json()["status"] == "published"
    second = admin.post(
        base, {"key": "ci", "spec": SPEC, "publish": True}, format="json"
    )
    assert second.json()["version"] == 2
    retired = admin.post(f"{base}/ci/versions/1/retire")
    assert retired.json()["status"] == "retired"
    again = admin.post(f"{base}/ci/versions/1/retire")
    assert again.status_code == 409
    assert again.json()["code"] == "ILLEGAL_TRANSITION"
    # each change is one event naming the person; the refused retire wrote none
    user = User.objects.get(username=f"p-{Role.ADMIN}-{tenant.slug}")
    trail = Event.objects.filter(tenant=tenant, code__startswith="contract.")
    assert list(trail.order_by("id").values_list("code", "actor_id")) == [
        ("contract.created", str(user.pk)),
        ("contract.published", str(user.pk)),
        ("contract.created", str(user.pk)),
        ("contract.retired", str(user.pk)),
    ]


def test_an_invalid_spec_lists_every_problem_and_saves_nothing(tenant):
    admin = person(tenant, Role.ADMIN)
    bad = {**SPEC, "policy": {"read_fields": "email"}, "extra": 1}
    response = admin.post(
        f"/api/v1/tenants/{tenant.slug}/contracts",
        {"key": "ci", "spec": bad},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "CONTRACT_INVALID"
    paths = {problem["path"] for problem in body["problems"]}
    assert {"/", "/policy", "/policy/read_fields"} <= paths
    assert not Contract.objects.exists()


@pytest.mark.parametrize("role", [None, Role.REVIEWER, Role.SUPPORT])
def test_only_administrators_may_change_contracts(tenant, role):
    response = person(tenant, role).post(
        f"/api/v1/tenants/{tenant.slug}/contracts",
        {"key": "ci", "spec": SPEC},
        format="json",
    )
    assert response.status_code == 404
    assert not Contract.objects.exists()


def test_another_tenants_admin_cannot_touch_them(tenant, other_tenant):
    Contract.objects.create(tenant=tenant, key="ci", version=1, spec=SPEC)
    stranger = person(other_tenant, Role.ADMIN)
    response = stranger.post(
        f"/api/v1/tenants/{tenant.slug}/contracts/ci/versions/1/publish"
    )
    assert response.status_code == 404
    assert Contract.objects.get().status == "draft"


def test_agents_read_their_tenants_contracts(tenant, make_agent):
    Contract.objects.create(
        tenant=tenant, key="ci", version=1, spec=SPEC, status="published"
    )
    agent = make_agent(tenant=tenant)
    secret = portal_services.agent_key_issue(agent=agent).secret
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    listed = client.get("/api/v1/contracts").json()
    assert [(c["key"], c["version"]) for c in listed] == [("ci", 1)]
    assert client.get("/api/v1/contracts/ci/versions/1").json()["spec"] == SPEC
    assert client.post("/api/v1/contracts", {}, format="json").status_code == 405
