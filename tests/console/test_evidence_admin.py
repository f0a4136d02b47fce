"""The task page's "Export evidence bundle" and the task list's action, per person.

Tenant A's reviewer and admin (``export_trail``) download the bundle, which the
offline verifier accepts; A's support (reads A, may not export) is refused with 403
and is not offered the button or the action; B's admin and a staff account without a
membership find no such task (404), as for any of A's rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from django.db import transaction
from django.urls import reverse

from audit import checkpoints
from audit import services as audit_services
from audit.models import Event, EventCode
from portal.actors import Actor
from portal.models import TenantPerm
from tasks.models import Task
from tests.support.evidence import verdict

from .conftest import PERSONAS, Cast

pytestmark = pytest.mark.django_db

EXPORTERS = {"reviewer_a", "admin_a"}
READERS = {"reviewer_a", "support_a", "admin_a"}


@pytest.fixture
def task(cast: Cast, make_task: Callable[..., Task]) -> Task:
    task = make_task(tenant=cast.a)
    with transaction.atomic():
        for n in range(3):
            audit_services.event_append(
                tenant_id=cast.a.pk,
                task_id=task.pk,
                code=EventCode.TASK_TRANSITIONED,
                actor=Actor.system("admin-evidence-test"),
                data={"n": n},
            )
    return task


def public_pem() -> str:
    return checkpoints.public_key_pem(checkpoints.signing_key().public)


def exported(cast: Cast) -> list[Event]:
    return list(Event.objects.filter(tenant=cast.a, code=EventCode.AUDIT_EXPORTED))


def assert_bundle(response, task: Task) -> None:
    assert response.status_code == 200, response.status_code
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == (
        f'attachment; filename="evidence-task-{task.pk}.json"'
    )
    bundle = json.loads(response.content)
    assert bundle["task"]["id"] == str(task.pk)
    assert len(bundle["chain"]["events"]) == 3
    assert verdict(bundle, public_pem()) == "intact"


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_task_pages_evidence_download(cast: Cast, task: Task, persona: str):
    client = cast.client(persona)
    response = client.get(reverse("admin:tasks_task_evidence", args=[task.pk]))
    if persona in EXPORTERS:
        assert_bundle(response, task)
        (record,) = exported(cast)
        assert record.actor_id == str(cast.people[persona].user.pk)
        assert record.payload["task_id"] == str(task.pk)
    else:
        # A's support reads the task but may not export; others do not see it at all
        assert response.status_code == (403 if persona in READERS else 404)
        assert not exported(cast)


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_button_shows_for_exporters_only(cast: Cast, task: Task, persona: str):
    client = cast.client(persona)
    page = client.get(reverse("admin:tasks_task_change", args=[task.pk]))
    if persona not in READERS:
        assert page.status_code in (302, 403)
        return
    assert page.status_code == 200
    link = reverse("admin:tasks_task_evidence", args=[task.pk])
    assert (f'id="export-evidence" href="{link}"' in page.content.decode()) == (
        persona in EXPORTERS
    )


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_task_list_action(cast: Cast, task: Task, persona: str):
    client = cast.client(persona)
    changelist = reverse("admin:tasks_task_changelist")
    listing = client.get(changelist)
    offered = listing.status_code == 200 and (
        'value="export_evidence"' in listing.content.decode()
    )
    # offered wherever the person may export somewhere (B's admin: for B's tasks)
    assert offered == cast.people[persona].may_anywhere(TenantPerm.EXPORT_TRAIL)
    response = client.post(
        changelist, {"action": "export_evidence", "_selected_action": [str(task.pk)]}
    )
    if persona in EXPORTERS:
        assert_bundle(response, task)
    else:
        # not offered: the admin refuses the page, or shows the list again
        assert response.status_code in (200, 302, 403)
        assert "Content-Disposition" not in response
        assert not exported(cast)


def test_the_action_wants_exactly_one_task(
    cast: Cast, task: Task, make_task: Callable[..., Task]
):
    second = make_task(tenant=cast.a)
    client = cast.client("reviewer_a")
    response = client.post(
        reverse("admin:tasks_task_changelist"),
        {
            "action": "export_evidence",
            "_selected_action": [str(task.pk), str(second.pk)],
        },
        follow=True,
    )
    assert response.status_code == 200
    assert "Select exactly one task" in response.content.decode()
    assert not exported(cast)


def test_a_task_of_another_tenant_cannot_be_slipped_into_the_action(
    cast: Cast, make_task: Callable[..., Task]
):
    """B's admin posts A's task id to the action: nothing is exported."""
    client = cast.client("member_of_b_only")
    foreign = make_task(tenant=cast.a)
    response = client.post(
        reverse("admin:tasks_task_changelist"),
        {"action": "export_evidence", "_selected_action": [str(foreign.pk)]},
        follow=True,
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert not exported(cast)


def test_without_a_signing_key_the_page_says_so(cast: Cast, task: Task, settings):
    settings.PRODUCTION = True
    settings.PORTAL_AUDIT_SIGNING_KEY = ""
    settings.PORTAL_AUDIT_SIGNING_KEY_FILE = ""
    client = cast.client("reviewer_a")
    response = client.get(
        reverse("admin:tasks_task_evidence", args=[task.pk]), follow=True
    )
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == reverse(
        "admin:tasks_task_change", args=[task.pk]
    )
    assert "No audit signing key is configured" in response.content.decode()
    assert not exported(cast)
