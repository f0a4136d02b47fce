"""The policy editor in the admin: drafts, problems with their line, the what-if over
a recorded week, publish and retire, each change one event naming the person; and
who may do what (tenant admin, reviewer, support, another tenant's admin)."""

from __future__ import annotations

import datetime as dt

import pytest

from audit.models import Event, EventCode
from console.admin.policies import policy_what_if
from policies import services as policy_services
from policies.engine import Verdict
from policies.models import PolicySet, PolicySetState
from portal.db import db_now
from tasks import services as task_services
from tasks.models import Operation, TaskState
from tests.support.contracts import SPEC

from .conftest import Cast

pytestmark = pytest.mark.django_db

PERMIT_ALL = "permit(principal, action, resource);\n"
NO_DELETES = 'forbid(principal, action == Action::"delete_ticket", resource);\n'
CHANGELIST = "/admin/policies/policyset/"


def change_url(policy_set: PolicySet) -> str:
    return f"{CHANGELIST}{policy_set.pk}/change/"


@pytest.fixture
def tenant_a(cast: Cast, make_agent):
    make_agent(tenant=cast.a, grants=("create_ticket", "delete_ticket"))
    task_services.contract_create(tenant=cast.a, key="issue", spec=SPEC, publish=True)
    return cast.a


def events(tenant, code: str) -> list[Event]:
    return list(Event.objects.filter(tenant=tenant, code=code).order_by("id"))


def test_an_admin_drafts_sees_the_problem_by_line_and_cannot_publish_it(
    cast, tenant_a, login
):
    admin_a = cast.people["admin_a"].user
    client = login(admin_a)
    added = client.post(
        f"{CHANGELIST}add/",
        {
            "tenant": str(tenant_a.pk),
            "text": PERMIT_ALL + "\nforbid(principal,\n  action resource);\n",
            "note": "typo",
        },
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    draft = PolicySet.objects.get(tenant=tenant_a)
    [created] = events(tenant_a, EventCode.POLICY_SET_CREATED)
    assert (created.actor_type, created.actor_id) == ("user", str(admin_a.pk))
    page = client.get(change_url(draft)).content.decode()
    assert "line 4: unexpected token" in page
    published = client.post(
        CHANGELIST,
        {"action": "publish_versions", "_selected_action": [str(draft.pk)]},
        follow=True,
    )
    assert "line 4: unexpected token" in published.content.decode()
    draft.refresh_from_db()
    assert draft.state == PolicySetState.DRAFT  # nothing half-published
    assert events(tenant_a, EventCode.POLICY_SET_PUBLISHED) == []


def test_an_admin_fixes_the_draft_publishes_and_retires_it(cast, tenant_a, login):
    admin_a = cast.people["admin_a"].user
    client = login(admin_a)
    draft = policy_services.policy_set_draft(tenant=tenant_a, text="nope")
    edited = client.post(change_url(draft), {"text": PERMIT_ALL, "note": "fixed"})
    assert edited.status_code == 302
    assert "Parses and fits" in client.get(change_url(draft)).content.decode()
    client.post(
        CHANGELIST, {"action": "publish_versions", "_selected_action": [str(draft.pk)]}
    )
    draft.refresh_from_db()
    assert (draft.state, draft.text, draft.published_by_id) == (
        PolicySetState.PUBLISHED,
        PERMIT_ALL.strip(),  # the form strips the text's ends
        admin_a.pk,
    )
    # Published: the page is read-only, an edit is refused.
    client.post(change_url(draft), {"text": NO_DELETES, "note": "x"})
    draft.refresh_from_db()
    assert draft.text == PERMIT_ALL.strip()
    client.post(
        CHANGELIST, {"action": "retire_versions", "_selected_action": [str(draft.pk)]}
    )
    draft.refresh_from_db()
    assert draft.state == PolicySetState.RETIRED
    for code in (
        EventCode.POLICY_SET_CHANGED,
        EventCode.POLICY_SET_PUBLISHED,
        EventCode.POLICY_SET_RETIRED,
    ):
        [event] = events(tenant_a, code)
        assert event.actor_id == str(admin_a.pk), code


@pytest.mark.parametrize("persona", ["reviewer_a", "support_a", "member_of_b_only"])
def test_others_neither_draft_nor_publish(cast, tenant_a, login, persona):
    draft = policy_services.policy_set_draft(tenant=tenant_a, text=PERMIT_ALL)
    client = login(cast.people[persona].user)
    page = client.get(change_url(draft))
    # The reviewer reads it; support and another tenant's admin do not see it.
    assert (page.status_code == 200) == (persona == "reviewer_a")
    client.post(change_url(draft), {"text": NO_DELETES, "note": "x"})
    client.post(
        CHANGELIST, {"action": "publish_versions", "_selected_action": [str(draft.pk)]}
    )
    draft.refresh_from_db()
    assert (draft.state, draft.text) == (PolicySetState.DRAFT, PERMIT_ALL)
    assert len(events(tenant_a, EventCode.POLICY_SET_CREATED)) == 1
    assert events(tenant_a, EventCode.POLICY_SET_CHANGED) == []


def test_the_what_if_lists_what_a_draft_would_have_changed_over_a_week(
    cast, tenant_a, make_task, login
):
    """A recorded week: one create and one delete a day, and older ones outside."""
    now = db_now()
    task = make_task(tenant=tenant_a, state=TaskState.RUNNING, leased=True)
    for day in range(10):  # days 7..9 are before the window
        for action in ("create_ticket", "delete_ticket"):
            Operation.objects.create(
                tenant=tenant_a,
                task=task,
                idempotency_key=f"{action}-{day}",
                action=action,
                target="ticket-desk",
                input_hash="0" * 64,
                input={"queue": "billing"},
                created_at=now - dt.timedelta(days=day, hours=1),
            )
    policy_services.policy_set_publish(
        tenant=tenant_a,
        version=policy_services.policy_set_draft(
            tenant=tenant_a, text=PERMIT_ALL
        ).version,
        contract_specs=[SPEC],
    )
    draft = policy_services.policy_set_draft(
        tenant=tenant_a, text=PERMIT_ALL + NO_DELETES
    )
    report = policy_what_if(policy_set=draft, days=7, now=now)
    assert report.evaluated == 14
    assert {change.ref for change in report.changes} == {
        str(pk)
        for pk in Operation.objects.filter(
            tenant=tenant_a,
            action="delete_ticket",
            created_at__gte=now - dt.timedelta(days=7),
        ).values_list("pk", flat=True)
    }
    assert all(
        (c.before.verdict, c.after.verdict) == (Verdict.ALLOW, Verdict.DENY)
        for c in report.changes
    )
    # Over 30 days the older deletes count too.
    assert len(policy_what_if(policy_set=draft, days=30, now=now).changes) == 10
    # And on the draft's page, as the tenant admin sees it before publishing.
    page = login(cast.people["admin_a"].user).get(change_url(draft)).content.decode()
    assert "7 would have gone differently" in page
    assert "14 operations evaluated" in page
    assert page.count("<td>delete_ticket</td>") == 7
