"""Comments on a desk item (issue 24 §2, Agent Inbox), as each role and as a member
of another tenant: support staff and tenant admins write them, everyone who reads
the desk reads them in the task's timeline, oldest first, with the author's name;
each is one ``task.commented`` event; nobody else writes one.
By raw SQL (tenant walls, append-only): tests/db/test_desk_comments.py."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from audit.models import Event, EventCode
from audit.redaction import keyed_hash
from console.models import DeskComment
from portal.models import Role

from .test_desk import DESK, escalate_task, make_person, messages_of, page

pytestmark = pytest.mark.django_db


def _as(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _comment(client: Client, task, body: str):
    return client.post(f"{DESK}{task.pk}/comment/", {"body": body})


def _timeline(html: str) -> str:
    """The item page's events table (the story's rendering)."""
    match = re.search(
        r'<table class="story-table" id="desk-events".*?</table>', html, re.S
    )
    assert match, "no timeline on the page"
    return match.group(0)


@pytest.mark.parametrize("role", [Role.SUPPORT, Role.ADMIN])
def test_a_person_who_works_the_desk_comments_and_everyone_reads_it(
    tenant, make_task, make_operation, role
):
    task = escalate_task(make_task, make_operation, tenant)
    writer = make_person("sam", {tenant: role})
    reader = make_person("rita", {tenant: Role.REVIEWER})
    client = _as(writer)
    # the item page offers the comment form to her
    assert 'id="desk-comment-form"' in client.get(page(task)).content.decode()
    # when she comments, she is back on the item page (POST, then redirect)
    answer = _comment(
        client, task, "  Called the customer: <b>wait</b> for the ticket  "
    )
    assert answer.status_code == 302
    assert answer["Location"] == page(task)
    shown = client.get(answer["Location"])
    assert "Comment added to the timeline." in messages_of(shown)
    # then one comment is stored, stripped, with one event naming it by id
    comment = DeskComment.objects.get(task_id=task.pk)
    text = "Called the customer: <b>wait</b> for the ticket"
    assert (comment.body, comment.author_id, comment.tenant_id) == (
        text,
        writer.pk,
        tenant.pk,
    )
    events = Event.objects.filter(task_id=task.pk, code=EventCode.TASK_COMMENTED)
    assert [(e.actor_type, e.actor_id, e.payload) for e in events] == [
        (
            "user",
            str(writer.pk),
            {
                "comment_id": str(comment.pk),
                "chars": len(text),
                "body_digest": keyed_hash(tenant.pk, text),
            },
        )
    ]
    # and the reviewer reads it in the timeline, escaped, by the author's name,
    # after the escalation (oldest first), without a form of her own
    html = _as(reader).get(page(task)).content.decode()
    timeline = _timeline(html)
    assert "Called the customer: &lt;b&gt;wait&lt;/b&gt; for the ticket" in timeline
    assert "<b>wait</b>" not in html
    assert timeline.index("task.escalated") < timeline.index("task.commented")
    row = timeline[
        timeline.index("task.commented") - 600 : timeline.index("task.commented")
    ]
    assert "sam" in row
    assert 'id="desk-comment-form"' not in html


def test_the_story_shows_the_comment_in_the_same_rendering(
    tenant, make_task, make_operation
):
    task = escalate_task(make_task, make_operation, tenant)
    sam = make_person("sam", {tenant: Role.SUPPORT})
    _comment(_as(sam), task, "second line of inquiry")
    rita = make_person("rita", {tenant: Role.REVIEWER})
    story = _as(rita).get(f"/admin/tasks/task/{task.pk}/change/").content.decode()
    assert "task.commented" in story
    assert "<dt>comment</dt><dd>second line of inquiry</dd>" in story
    desk = _timeline(_as(rita).get(page(task)).content.decode())
    assert "<dt>comment</dt><dd>second line of inquiry</dd>" in desk


def test_a_reviewer_cannot_comment(tenant, make_task, make_operation):
    task = escalate_task(make_task, make_operation, tenant)
    rita = make_person("rita", {tenant: Role.REVIEWER})
    assert _comment(_as(rita), task, "I may only read").status_code == 403
    assert not DeskComment.objects.exists()
    assert not Event.objects.filter(code=EventCode.TASK_COMMENTED).exists()


def test_a_member_of_another_tenant_can_neither_comment_nor_read_comments(
    tenant, other_tenant, make_task, make_operation
):
    task = escalate_task(make_task, make_operation, tenant)
    _comment(_as(make_person("sam", {tenant: Role.SUPPORT})), task, "for A only")
    bob = make_person("bob", {other_tenant: Role.ADMIN})
    client = _as(bob)
    assert _comment(client, task, "from B").status_code == 404
    assert list(DeskComment.objects.values_list("body", flat=True)) == ["for A only"]
    detail = client.get(page(task), follow=True).content.decode()
    assert "for A only" not in detail
    story = client.get(f"/admin/tasks/task/{task.pk}/change/", follow=True)
    assert "for A only" not in story.content.decode()


def test_staff_of_no_tenant_cannot_comment(tenant, make_task, make_operation):
    task = escalate_task(make_task, make_operation, tenant)
    stan = make_person("stan", {})
    assert _comment(_as(stan), task, "hello").status_code in (403, 404)
    assert not DeskComment.objects.exists()


@pytest.mark.parametrize("body", ["", "   \n ", "x" * 2001])
def test_an_empty_or_too_long_comment_is_a_message_and_writes_nothing(
    tenant, make_task, make_operation, body
):
    task = escalate_task(make_task, make_operation, tenant)
    client = _as(make_person("sam", {tenant: Role.SUPPORT}))
    answer = _comment(client, task, body)
    assert answer.status_code == 302
    shown = messages_of(client.get(answer["Location"]))
    assert any("A comment" in m for m in shown), shown
    assert not DeskComment.objects.exists()
    assert not Event.objects.filter(code=EventCode.TASK_COMMENTED).exists()


def test_the_item_page_reads_comments_in_one_query(
    tenant, make_task, make_operation, django_assert_max_num_queries
):
    task = escalate_task(make_task, make_operation, tenant)
    client = _as(make_person("sam", {tenant: Role.SUPPORT}))
    _comment(client, task, "one")
    with django_assert_max_num_queries(100) as one:
        client.get(page(task))
    for n in range(5):
        _comment(client, task, f"more {n}")
    with django_assert_max_num_queries(100) as six:
        html = client.get(page(task)).content.decode()
    assert html.count("task.commented") >= 6
    assert len(six.captured_queries) == len(one.captured_queries)
