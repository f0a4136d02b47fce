"""The takeover desk as each role uses it: list, evidence, claim, release, resolve."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import Event, EventCode
from audit.redaction import keyed_hash
from console.admin.desk import TakeoverDeskAdmin
from console.takeover_desk import names as desk_names
from portal import services as portal_services
from portal.actors import Actor
from portal.models import Role, Tenant
from tasks import escalation, takeover
from tasks.exceptions import InvalidCursor
from tasks.models import ObjectVersion, Operation, OperationState, Task, TaskState

pytestmark = pytest.mark.django_db

DESK = "/admin/console/takeoveritem/"
SECRET = "sk_live_0123456789abcdef"


def escalate(**kwargs: Any) -> Any:
    """The one line that changes when escalate moves to tasks.takeover."""
    return escalation.escalate(**kwargs)


def make_person(
    name: str, memberships: dict[Tenant, Role], password: str | None = None
) -> User:
    """A staff user (admin login needs it) with these roles, never a superuser.

    Without ``password`` the user can only be logged in by the test client
    (hashing a password costs a second on a busy machine).
    """
    user = User.objects.create_user(name, password=password, is_staff=True)
    for tenant, role in memberships.items():
        portal_services.membership_grant(tenant=tenant, user=user, role=role)
    return user


def escalate_task(make_task, make_operation, tenant: Tenant, n: int = 1042) -> Task:
    """A running task whose ticket call ended in doubt, handed to a person.

    Realistic evidence: the plan, the version read (7) against the current one
    (9), one stale field and two receipts; the operation's call fields hold a
    secret that must never reach the page.
    """
    task = make_task(
        tenant=tenant,
        state=TaskState.RUNNING,
        leased=True,
        client_task_id=f"issue-{n}",
        object_id=str(n),
        object_version="7",
    )
    operation = make_operation(
        task=task,
        state=OperationState.UNKNOWN,
        idempotency_key=f"ticket-for-issue-{n}",
        input={"queue": "billing", "summary": f"Refund for issue {n}"},
        call_fields={"email": "ana@example.com", "api_key": SECRET},
    )
    ObjectVersion.objects.update_or_create(
        tenant=tenant,
        object_type=task.object_type,
        object_id=task.object_id,
        defaults={"version": "9"},
    )
    with transaction.atomic():
        escalate(
            tenant=tenant,
            task=task,
            operation=operation,
            reason="MULTIPLE_RECEIPTS",
            evidence={
                "plan": {
                    "action": "create_ticket",
                    "target": "ticket-desk",
                    "idempotency_key": operation.idempotency_key,
                    "object": {"type": "customer_issue", "id": str(n)},
                },
                "version_read": "7",
                "current_version": "9",
                "conflicting_fields": [
                    {"field": "email", "problem": "FIELD_STALE", "age_s": 900}
                ],
                "receipts": [f"T-{n}-a", f"T-{n}-b"],
            },
            actor=Actor.system("test"),
        )
    return Task.objects.get(pk=task.pk)


@pytest.fixture
def escalated(make_task, make_operation, tenant) -> Task:
    return escalate_task(make_task, make_operation, tenant)


@pytest.fixture
def people(tenant, other_tenant) -> dict[str, User]:
    return {
        "support": make_person("sam", {tenant: Role.SUPPORT}),
        "support2": make_person("kim", {tenant: Role.SUPPORT}),
        "reviewer": make_person("rita", {tenant: Role.REVIEWER}),
        "admin": make_person("ada", {tenant: Role.ADMIN}),
        "other": make_person("bob", {other_tenant: Role.SUPPORT}),
        "staff": make_person("stan", {}),
    }


def as_(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def page(task: Task) -> str:
    return f"{DESK}{task.pk}/change/"


# --- reading --------------------------------------------------------------------


@pytest.mark.parametrize("role", ["support", "reviewer", "admin"])
def test_the_desk_lists_the_tenants_waiting_tasks(people, escalated, role):
    response = as_(people[role]).get(DESK)
    assert response.status_code == 200
    body = response.content.decode()
    assert "issue-1042" in body
    # The reason reads as its stored code in the column and the filter, as the story
    # and the exports show it, never as Django's label.
    assert "MULTIPLE_RECEIPTS" in body
    assert "Multiple Receipts" not in body
    assert "reason_code__exact=FIELD_STALE" in body  # the filter's entries, by code
    assert ">FIELD_STALE<" in body
    assert "customer_issue/1042" in body
    assert re.search(r"\d+ (s|min)", body)  # the age, in words
    assert "worker-1" in body  # the responsible owner: who held the lease


def test_a_member_of_another_tenant_sees_none_of_its_rows(
    people, escalated, make_task, make_operation, other_tenant
):
    theirs = escalate_task(make_task, make_operation, other_tenant, n=7)
    client = as_(people["other"])
    listing = client.get(DESK).content.decode()
    assert "issue-7" in listing
    assert "issue-1042" not in listing
    detail = client.get(page(escalated))
    assert detail.status_code == 302  # the admin's "no such object"
    assert "issue-1042" not in client.get(detail["Location"]).content.decode()
    assert client.get(page(theirs)).status_code == 200


def test_staff_without_a_membership_get_403(people, escalated):
    client = as_(people["staff"])
    assert client.get(DESK).status_code == 403
    assert client.get(page(escalated)).status_code in (302, 403)
    assert "issue-1042" not in client.get(page(escalated), follow=True).content.decode()


def test_the_evidence_page_shows_plan_versions_fields_receipts_redacted(
    people, escalated
):
    response = as_(people["support"]).get(page(escalated))
    assert response.status_code == 200
    body = response.content.decode()
    assert "ticket-for-issue-1042" in body  # the plan and the operation
    assert "differs from the version read" in body  # 9 against 7
    assert 'id="desk-conflicting-fields"' in body and "FIELD_STALE" in body
    assert "T-1042-a" in body and "T-1042-b" in body
    # call fields are shown redacted: the e-mail as its keyed hash, the key cut out
    # (issue 9: the customer's e-mail was on this page)
    assert "ana@example.com" not in body
    assert f"[email:{keyed_hash(escalated.tenant_id, 'ana@example.com')}]" in body
    assert SECRET not in body
    assert "[REDACTED]" in body
    assert "task.escalated" in body  # the timeline
    assert 'id="desk-claim"' in body


def test_a_reviewer_reads_the_evidence_without_buttons(people, escalated):
    body = as_(people["reviewer"]).get(page(escalated)).content.decode()
    assert "T-1042-a" in body
    for button in ("desk-claim", "desk-release", "desk-resolve", "desk-actions"):
        assert f'id="{button}"' not in body
    assert 'name="_save"' not in body


# --- refusals -------------------------------------------------------------------


def _trail(task: Task) -> list[str]:
    return list(
        Event.objects.filter(task_id=task.pk)
        .order_by("id")
        .values_list("code", flat=True)
    )


def test_a_reviewers_claim_is_403_and_changes_nothing(people, escalated):
    before = _trail(escalated)
    for action in ("claim", "release", "resolve"):
        response = as_(people["reviewer"]).post(
            f"{DESK}{escalated.pk}/{action}/", {"resolution": "cancel"}
        )
        assert response.status_code == 403, action
    task = Task.objects.get(pk=escalated.pk)
    assert (task.state, task.state_version) == (
        TaskState.HUMAN_REQUIRED,
        escalated.state_version,
    )
    assert _trail(escalated) == before


@pytest.mark.parametrize("who", ["other", "staff"])
def test_outsiders_posts_are_404_and_change_nothing(people, escalated, who):
    response = as_(people[who]).post(f"{DESK}{escalated.pk}/claim/")
    assert response.status_code == 404
    assert Task.objects.get(pk=escalated.pk).state == TaskState.HUMAN_REQUIRED


def test_a_get_on_a_button_url_is_405(people, escalated):
    assert as_(people["support"]).get(f"{DESK}{escalated.pk}/claim/").status_code == 405


def test_the_forms_carry_csrf_and_a_post_without_it_is_refused(people, escalated):
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["support"])
    body = client.get(page(escalated)).content.decode()
    assert "csrfmiddlewaretoken" in body
    assert client.post(f"{DESK}{escalated.pk}/claim/").status_code == 403
    assert Task.objects.get(pk=escalated.pk).state == TaskState.HUMAN_REQUIRED


# --- claim, release, resolve ----------------------------------------------------


def test_a_second_claim_is_refused_with_the_first_claimers_name(people, escalated):
    first = as_(people["support"]).post(f"{DESK}{escalated.pk}/claim/", follow=True)
    assert any("You claimed this task" in m for m in messages_of(first))
    assert "Claimed by sam" in first.content.decode()
    claimed = Task.objects.get(pk=escalated.pk)
    late = as_(people["support2"]).post(f"{DESK}{escalated.pk}/claim/", follow=True)
    assert late.status_code == 200
    assert "Someone else claimed this task first: sam." in messages_of(late)
    after = Task.objects.get(pk=escalated.pk)
    assert (after.lease_owner, after.state_version) == (
        f"user:{people['support'].pk}",
        claimed.state_version,
    )
    assert _trail(escalated).count(EventCode.TASK_HUMAN_CLAIMED) == 1


def test_only_the_claimer_may_resolve_or_release(people, escalated):
    as_(people["support"]).post(f"{DESK}{escalated.pk}/claim/")
    before = _trail(escalated)
    other = as_(people["support2"])
    for action in ("release", "resolve"):
        response = other.post(
            f"{DESK}{escalated.pk}/{action}/", {"resolution": "cancel"}, follow=True
        )
        assert any("claimed by sam" in m for m in messages_of(response)), action
    assert Task.objects.get(pk=escalated.pk).state == TaskState.HUMAN_CLAIMED
    assert _trail(escalated) == before


def test_release_puts_the_task_back(people, escalated):
    client = as_(people["support"])
    client.post(f"{DESK}{escalated.pk}/claim/")
    response = client.post(f"{DESK}{escalated.pk}/release/", follow=True)
    assert any("back in the queue" in m for m in messages_of(response))
    assert Task.objects.get(pk=escalated.pk).state == TaskState.HUMAN_REQUIRED
    assert 'id="desk-claim"' in response.content.decode()


def test_verify_with_a_receipt_id_names_the_person_in_the_event(people, escalated):
    operation = Operation.objects.get(task_id=escalated.pk)
    assert operation.state == OperationState.HUMAN_REQUIRED
    client = as_(people["support"])
    client.post(f"{DESK}{escalated.pk}/claim/")
    response = client.post(
        f"{DESK}{escalated.pk}/resolve/",
        {
            "resolution": "verify",
            "operation_id": str(operation.pk),
            "provider_reference": "T-1042-a",
            "note": "found it in the desk",
        },
        follow=True,
    )
    assert "Resolved: verify." in messages_of(response)
    operation.refresh_from_db()
    assert (operation.state, operation.provider_reference) == (
        OperationState.VERIFIED,
        "T-1042-a",
    )
    assert Task.objects.get(pk=escalated.pk).state == TaskState.PENDING
    resolved = Event.objects.get(task_id=escalated.pk, code=EventCode.TASK_RESOLVED)
    assert (resolved.actor_type, resolved.actor_id) == (
        "user",
        str(people["support"].pk),
    )
    assert resolved.payload["provider_reference"] == "T-1042-a"
    # The page stays readable after the task left the queue, and names them.
    body = response.content.decode()
    assert re.search(
        r"sam \(person\)</span></td>\s*<td class=\"nowrap\"><strong>task\.resolved<",
        body,
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"resolution": "verify"}, "needs operation_id"),
        ({"resolution": "verify", "operation_id": "OP"}, "receipt id"),
        ({"resolution": "explode"}, "Not resolved: resolution"),
        ({"resolution": "verify", "operation_id": "not-a-uuid"}, "Not resolved"),
    ],
)
def test_bad_resolutions_are_messages_not_500s(people, escalated, data, message):
    client = as_(people["support"])
    client.post(f"{DESK}{escalated.pk}/claim/")
    if data.get("operation_id") == "OP":
        data = {**data, "operation_id": str(Operation.objects.get().pk)}
    before = _trail(escalated)
    response = client.post(f"{DESK}{escalated.pk}/resolve/", data, follow=True)
    assert response.status_code == 200
    assert any(message in m for m in messages_of(response)), messages_of(response)
    assert Task.objects.get(pk=escalated.pk).state == TaskState.HUMAN_CLAIMED
    assert _trail(escalated) == before


def test_claiming_a_settled_task_is_a_message(people, escalated):
    client = as_(people["support"])
    client.post(f"{DESK}{escalated.pk}/claim/")
    client.post(f"{DESK}{escalated.pk}/resolve/", {"resolution": "cancel"})
    response = client.post(f"{DESK}{escalated.pk}/claim/", follow=True)
    assert any("not allowed" in m for m in messages_of(response))


# --- keyset pages ---------------------------------------------------------------


@pytest.fixture
def five(make_task, make_operation, tenant) -> list[Task]:
    return [escalate_task(make_task, make_operation, tenant, n=n) for n in range(5)]


def _walk(client: Client, url: str) -> tuple[list[str], list[str]]:
    """Follow "next page" links; the tasks in order and every SQL statement."""
    seen: list[str] = []
    sql: list[str] = []
    while url:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200
        sql += [q["sql"] for q in queries.captured_queries]
        seen += [str(row.pk) for row in response.context["cl"].result_list]
        url = (
            response.context["cl"].next_link and DESK + response.context["cl"].next_link
        )
    return seen, sql


@pytest.mark.parametrize("order", ["newest", "oldest"])
def test_keyset_pages_reach_every_row_in_order_without_offset_or_count(
    people, five, monkeypatch, order
):
    monkeypatch.setattr(TakeoverDeskAdmin, "list_per_page", 2)
    seen, sql = _walk(as_(people["support"]), f"{DESK}?dir={order}")
    expected = sorted(five, key=lambda t: (t.updated_at, t.pk))
    if order == "newest":
        expected.reverse()
    assert seen == [str(t.pk) for t in expected]
    task_sql = [s for s in sql if '"tasks_task"' in s]
    assert task_sql
    assert not [s for s in task_sql if "OFFSET" in s.upper()]
    assert not [s for s in task_sql if "COUNT(" in s.upper()]


def test_the_direction_toggle_and_filters_start_from_the_first_page(people, five):
    client = as_(people["support"])
    response = client.get(DESK)
    cl = response.context["cl"]
    assert cl.newest_first
    assert "dir=oldest" in cl.oldest_link
    assert 'id="desk-oldest"' in response.content.decode()
    assert "after=" not in cl.get_query_string({"reason_code": "FIELD_STALE"})


def test_a_broken_cursor_is_a_warning_and_the_first_page(people, escalated):
    response = as_(people["support"]).get(f"{DESK}?after=bm9wZQ")
    assert response.status_code == 200
    assert any("start again" in m for m in messages_of(response))
    assert "issue-1042" in response.content.decode()


def test_the_list_costs_the_same_queries_for_two_rows_or_six(
    people, make_task, make_operation, tenant
):
    client = as_(people["support"])
    for n in range(2):
        escalate_task(make_task, make_operation, tenant, n=100 + n)
    with CaptureQueriesContext(connection) as few:
        client.get(DESK)
    for n in range(4):
        escalate_task(make_task, make_operation, tenant, n=200 + n)
    with CaptureQueriesContext(connection) as more:
        client.get(DESK)
    assert len(more.captured_queries) == len(few.captured_queries)


def test_filters_by_state_show_claimed_and_settled(people, five):
    client = as_(people["support"])
    client.post(f"{DESK}{five[0].pk}/claim/")
    client.post(f"{DESK}{five[1].pk}/claim/")
    client.post(f"{DESK}{five[1].pk}/resolve/", {"resolution": "cancel"})

    def rows(query: str) -> set[str]:
        cl = client.get(f"{DESK}?{query}").context["cl"]
        return {str(row.pk) for row in cl.result_list}

    assert rows("state=human_claimed") == {str(five[0].pk)}
    assert rows("state=settled") == {str(five[1].pk)}
    assert str(five[1].pk) not in rows("")
    claimed = client.get(f"{DESK}?state=human_claimed").content.decode()
    assert ">sam<" in claimed  # claimed by, as a name


# --- the API queue's pages (selector for TakeoverQueueApi) -------------------------


def test_the_api_queue_pages_by_cursor_both_ways(people, five, other_tenant):
    support = people["support"]
    first = takeover.takeover_queue_page(user=support, limit=2)
    assert [t.pk for t in first.items] == [five[0].pk, five[1].pk]
    assert first.next_cursor is not None
    rest = takeover.takeover_queue_page(
        user=support, limit=10, after=first.next_cursor.encode()
    )
    assert [t.pk for t in rest.items] == [t.pk for t in five[2:]]
    assert rest.next_cursor is None
    newest = takeover.takeover_queue_page(user=support, limit=1, newest_first=True)
    assert newest.items[0].pk == five[-1].pk
    assert takeover.takeover_queue_page(user=people["other"]).items == []
    assert takeover.takeover_queue_page(user=people["reviewer"]).items == []
    with pytest.raises(InvalidCursor):
        takeover.takeover_queue_page(user=support, after="garbage!")


def test_ages_read_as_words():
    import datetime as dt

    assert desk_names.human_age(dt.timedelta(seconds=42)) == "42 s"
    assert desk_names.human_age(dt.timedelta(minutes=12, seconds=5)) == "12 min"
    assert desk_names.human_age(dt.timedelta(hours=3, minutes=5)) == "3 h 5 min"
    assert desk_names.human_age(dt.timedelta(days=2, hours=4)) == "2 d 4 h"
    assert desk_names.human_age(dt.timedelta(seconds=-3)) == "0 s"


def test_a_tenant_admin_gets_the_buttons_too(people, escalated):
    body = as_(people["admin"]).get(page(escalated)).content.decode()
    assert 'id="desk-claim"' in body
    response = as_(people["admin"]).post(f"{DESK}{escalated.pk}/claim/")
    assert response.status_code == 302
    assert Task.objects.get(pk=escalated.pk).lease_owner == f"user:{people['admin'].pk}"


@pytest.mark.parametrize(
    "query",
    ["state=bogus", "reason_code=BOGUS", "tenant=not-a-uuid", "dir=sideways", "o=3"],
)
def test_odd_query_strings_are_not_500s(people, escalated, query):
    response = as_(people["support"]).get(f"{DESK}?{query}")
    assert response.status_code in (200, 302)
