"""Takeover endpoints for people: session auth, membership scope, one claim wins."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from portal import services as portal_services
from portal.actors import Actor
from portal.models import Role
from tasks import escalation
from tasks.models import Escalation, Task, TaskState

pytestmark = pytest.mark.django_db


@pytest.fixture
def escalated(make_task, tenant):
    """A task handed to a person, with its evidence."""
    from django.db import transaction

    task = make_task(state=TaskState.RUNNING, leased=True)
    with transaction.atomic():
        escalation.escalate(
            tenant=tenant,
            task=task,
            operation=None,
            reason="FIELD_STALE",
            evidence={"conflicting_fields": [{"field": "email"}]},
            actor=Actor.system("test"),
        )
    return Task.objects.get(pk=task.pk)


def person(tenant, name: str, role: Role | None) -> APIClient:
    user = User.objects.create_user(name, password="pw-for-tests-only-1")
    if role is not None:
        portal_services.membership_grant(tenant=tenant, user=user, role=role)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def post(client: APIClient, path: str, data=None):
    """A browser-like POST: the CSRF cookie from a GET, sent back as a header."""
    client.get("/api/v1/takeover/queue")
    token = client.cookies.get("csrftoken")
    headers = {"X-CSRFToken": token.value} if token else {}
    return client.post(path, data, format="json", headers=headers)


def test_the_queue_lists_escalated_tasks_with_their_evidence(escalated, tenant):
    support = person(tenant, "sam", Role.SUPPORT)
    items = support.get("/api/v1/takeover/queue").json()["results"]
    assert [item["id"] for item in items] == [str(escalated.pk)]
    assert items[0]["reason_code"] == "FIELD_STALE"
    assert items[0]["escalations"][0]["evidence"]["conflicting_fields"][0]["field"] == (
        "email"
    )


def test_claim_release_resolve_over_http(escalated, tenant):
    support = person(tenant, "sam", Role.SUPPORT)
    claimed = post(support, f"/api/v1/takeover/tasks/{escalated.pk}/claim")
    assert claimed.status_code == 200, claimed.content
    assert claimed.json()["state"] == "human_claimed"
    assert claimed.json()["lease"]["token"] > escalated.lease_token
    resolved = post(
        support,
        f"/api/v1/takeover/tasks/{escalated.pk}/resolve",
        {"resolution": "hand_back", "note": "fields refreshed upstream"},
    )
    assert resolved.json()["state"] == "pending"
    assert Escalation.objects.get(task=escalated).resolution == "hand_back"


def test_a_second_claim_is_409(escalated, tenant):
    post(
        person(tenant, "sam", Role.SUPPORT),
        f"/api/v1/takeover/tasks/{escalated.pk}/claim",
    )
    late = post(
        person(tenant, "kim", Role.ADMIN),
        f"/api/v1/takeover/tasks/{escalated.pk}/claim",
    )
    assert late.status_code == 409
    assert late.json()["code"] == "ALREADY_CLAIMED"


def test_only_the_claimer_may_resolve(escalated, tenant):
    post(
        person(tenant, "sam", Role.SUPPORT),
        f"/api/v1/takeover/tasks/{escalated.pk}/claim",
    )
    other = person(tenant, "kim", Role.SUPPORT)
    response = post(
        other,
        f"/api/v1/takeover/tasks/{escalated.pk}/resolve",
        {"resolution": "cancel"},
    )
    assert response.status_code == 409
    assert response.json()["code"] == "NOT_YOUR_CLAIM"


@pytest.mark.parametrize("role", [None, Role.REVIEWER])
def test_people_without_a_support_role_see_nothing(escalated, tenant, role):
    outsider = person(tenant, "rev", role)
    assert outsider.get("/api/v1/takeover/queue").json()["results"] == []
    response = post(outsider, f"/api/v1/takeover/tasks/{escalated.pk}/claim")
    assert response.status_code == 404
    assert Task.objects.get(pk=escalated.pk).state == TaskState.HUMAN_REQUIRED


def test_another_tenants_support_staff_get_404(escalated, other_tenant):
    stranger = person(other_tenant, "eve", Role.SUPPORT)
    assert stranger.get("/api/v1/takeover/queue").json()["results"] == []
    for action in ("claim", "release", "resolve"):
        response = post(
            stranger,
            f"/api/v1/takeover/tasks/{escalated.pk}/{action}",
            {"resolution": "cancel"},
        )
        assert response.status_code == 404, action
    assert Task.objects.get(pk=escalated.pk).state == TaskState.HUMAN_REQUIRED


def test_no_session_no_access(escalated):
    response = APIClient().get("/api/v1/takeover/queue")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"


def test_a_post_without_the_csrf_token_is_refused(escalated, tenant):
    support = person(tenant, "sam", Role.SUPPORT)
    response = support.post(f"/api/v1/takeover/tasks/{escalated.pk}/claim")
    assert response.status_code == 403
    assert Task.objects.get(pk=escalated.pk).state == TaskState.HUMAN_REQUIRED


def test_the_queue_pages_past_any_size_both_ways(make_task, tenant):
    """250 escalations: following `next` reaches every one once, from either end;
    the newest is on the first page of `order=newest` (it was invisible past 200)."""
    from django.db import transaction

    tasks = []
    for _ in range(250):
        task = make_task(state=TaskState.RUNNING, leased=True)
        with transaction.atomic():
            escalation.escalate(
                tenant=tenant,
                task=task,
                operation=None,
                reason="FIELD_STALE",
                evidence={},
                actor=Actor.system("test"),
            )
        tasks.append(task.pk)
    support = person(tenant, "sam", Role.SUPPORT)
    for order in ("oldest", "newest"):
        seen, url = [], f"/api/v1/takeover/queue?order={order}&page_size=100"
        while url:
            page = support.get(url)
            assert page.status_code == 200
            seen += [item["id"] for item in page.json()["results"]]
            url = page.json()["next"]
        assert len(seen) == len(set(seen)) == 250
        expected = [str(pk) for pk in tasks]
        assert seen == (expected if order == "oldest" else expected[::-1])
    assert support.get("/api/v1/takeover/queue?after=garbage").status_code == 404
