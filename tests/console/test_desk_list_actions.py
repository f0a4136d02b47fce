"""The takeover desk's list as an inbox (issue 24 §2, Agent Inbox): claim a waiting
item, hand back or release one's own claim from the list, without opening the
item; the same POSTs as the item's buttons, the same services, the same refusals.
In Chromium: tests/browser/test_desk_list_actions.py."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import Event, EventCode
from portal.models import Role
from tasks.models import Task, TaskState

from .test_desk import DESK, escalate_task, make_person

pytestmark = pytest.mark.django_db


def _as(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _post(client: Client, task: Task, what: str, **data: str):
    return client.post(
        f"{DESK}{task.pk}/{what}/",
        {"back": "list", "list_query": "state=human_required&o=x", **data},
    )


def test_support_claims_and_hands_back_from_the_list(tenant, make_task, make_operation):
    task = escalate_task(make_task, make_operation, tenant)
    sam = make_person("sam", {tenant: Role.SUPPORT})
    client = _as(sam)
    # the list offers a claim on the waiting item
    html = client.get(DESK).content.decode()
    assert f'action="{DESK}{task.pk}/claim/"' in html
    assert "desk-row-hand-back" not in html
    # when she claims from the list, she is back on the list (its filters kept),
    # told which task she claimed
    claimed = _post(client, task, "claim")
    assert claimed.status_code == 302
    assert claimed["Location"] == f"{DESK}?state=human_required&o=x"
    listed = client.get(f"{DESK}?state=human_claimed").content.decode()
    assert f"{task.client_task_id}: You claimed this task" in listed
    task.refresh_from_db()
    assert (task.state, task.lease_owner) == (TaskState.HUMAN_CLAIMED, f"user:{sam.pk}")
    # and her claimed row offers hand back and release, not claim
    assert f'action="{DESK}{task.pk}/resolve/"' in listed
    assert f'action="{DESK}{task.pk}/release/"' in listed
    assert f'action="{DESK}{task.pk}/claim/"' not in listed
    # a hand back without a note is refused, named, nothing changed
    refused = _post(client, task, "resolve", resolution="hand_back")
    assert refused["Location"].startswith(DESK + "?")
    task.refresh_from_db()
    assert task.state == TaskState.HUMAN_CLAIMED
    # with a note it is handed back, the same service and event as the item page
    _post(client, task, "resolve", resolution="hand_back", note="re-read the issue")
    task.refresh_from_db()
    assert task.state == TaskState.PENDING
    resolved = Event.objects.get(task_id=task.pk, code=EventCode.TASK_RESOLVED)
    assert resolved.payload["resolution"] == "hand_back"
    assert resolved.actor_id == str(sam.pk)


def test_a_claim_by_someone_else_first_is_said_on_the_list(
    tenant, make_task, make_operation
):
    task = escalate_task(make_task, make_operation, tenant)
    sam = make_person("sam", {tenant: Role.SUPPORT})
    ana = make_person("ana", {tenant: Role.SUPPORT})
    sam_list = _as(sam)
    sam_list.get(DESK)
    # ana claims first
    _post(_as(ana), task, "claim")
    # sam's click on the list he loaded before is refused in words
    _post(sam_list, task, "claim")
    html = sam_list.get(DESK).content.decode()
    assert f"{task.client_task_id}: Someone else claimed this task first: ana" in html
    # and ana's claimed row offers sam nothing
    row_start = html.index(task.client_task_id)
    assert "desk-row-act" not in html[row_start : row_start + 3000].split("</tr>")[0]


@pytest.mark.parametrize("role", [Role.REVIEWER])
def test_a_reviewer_sees_no_buttons_and_is_refused(
    tenant, make_task, make_operation, role
):
    task = escalate_task(make_task, make_operation, tenant)
    rita = _as(make_person("rita", {tenant: role}))
    html = rita.get(DESK).content.decode()
    assert task.client_task_id in html and "desk-row-act" not in html
    assert _post(rita, task, "claim").status_code == 403
    task.refresh_from_db()
    assert task.state == TaskState.HUMAN_REQUIRED


def test_another_tenants_member_gets_404(
    tenant, other_tenant, make_task, make_operation
):
    task = escalate_task(make_task, make_operation, tenant)
    olga = _as(make_person("olga", {other_tenant: Role.ADMIN}))
    assert task.client_task_id not in olga.get(DESK).content.decode()
    assert _post(olga, task, "claim").status_code == 404
    task.refresh_from_db()
    assert task.state == TaskState.HUMAN_REQUIRED
