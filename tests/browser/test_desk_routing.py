"""Take over and Reassign on the takeover desk in Chromium (issue 22 §1): support
staff in the item's group take it and move it to On-call, each move an event naming
them, and On-call is told by a real SMTP server and a real webhook receiver; a
reviewer sees no buttons and a POST of theirs is refused; another tenant's member
finds no such item. The screenshot is docs/screenshots/desk-routing.png."""

from __future__ import annotations

import pytest

from audit.models import Event, EventCode
from portal.models import Role
from routing import delivery
from routing.models import Assignment
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot
from tests.console.test_desk import SECRET, escalate_task, make_person
from tests.routing import conftest as routing_world
from tests.routing.conftest import Inbox, Receiver

pytestmark = pytest.mark.django_db(transaction=True)

# routing's real SMTP server, webhook receiver and groups (tests/routing/conftest.py)
smtp = routing_world.smtp
receiver = routing_world.receiver
desk = routing_world.desk


def _post_as_page(page, url: str, data: dict[str, str] | None = None):
    """A POST with the page's session and CSRF token, as a hand-made form would."""
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    return page.request.post(
        url,
        form={"csrfmiddlewaretoken": token, **(data or {})},
        headers={"Referer": page.url},
        max_redirects=0,
    )


def test_support_takes_over_and_reassigns_and_the_new_group_is_told(
    page, browser, live_server, desk, smtp: Inbox, receiver: Receiver, other_tenant,
    make_task, make_operation,
):  # fmt: skip
    # Given an item with Billing (Ana's group), its first messages out
    desk.rule.reason_code = "MULTIPLE_RECEIPTS"
    desk.rule.save(update_fields=["reason_code"])
    task = escalate_task(make_task, make_operation, desk.tenant)
    delivery.notifications_deliver_once()
    smtp.messages.clear()
    receiver.posts.clear()
    ana = desk.members["ana"]
    ana.set_password(PASSWORD)
    ana.save(update_fields=["password"])
    item_url = f"{live_server.url}/admin/console/takeoveritem/{task.pk}/change/"

    # When Ana (support, Billing) opens the item
    page.set_viewport_size({"width": 1366, "height": 820})
    log_in(page, live_server, "ana")
    page.goto(item_url)
    page.wait_for_selector("#desk-routing")
    assert page.inner_text("#desk-sla-group") == "Billing"
    options = page.locator("#desk-reassign-to option").all_inner_texts()
    assert options == [
        "Billing (has it now)",
        "Billing → ana",
        "Billing → bo",
        "On-call",
        "On-call → cy",
    ]

    # and takes it over
    page.click("#desk-take-over")
    page.wait_for_selector(".messagelist")
    assert "You took this item over" in page.inner_text(".messagelist")
    assert "taken by ana" in page.inner_text("#desk-sla")
    page.locator("#desk-status").scroll_into_view_if_needed()
    docs_shot(page, "desk-routing.png")

    # and moves it to On-call
    page.select_option("#desk-reassign-to", label="On-call")
    page.click("#desk-reassign")
    page.wait_for_selector(".messagelist")

    # Then On-call has it, and both moves are events naming Ana
    assert "Moved" in page.inner_text(".messagelist")
    assert page.inner_text("#desk-sla-group") == "On-call"
    item = Assignment.objects.get(tenant=desk.tenant, task_id=task.pk)
    assert (item.group_id, item.person_id) == (desk.backup.pk, None)
    moves = Event.objects.filter(task_id=task.pk, code=EventCode.DESK_ITEM_REASSIGNED)
    assert [(e.actor_type, e.actor_id) for e in moves.order_by("id")] == [
        ("user", str(ana.pk)),
        ("user", str(ana.pk)),
    ]

    # and On-call is told: Cy's e-mail at the SMTP server, a signed post at the
    # receiver, both linking the item and carrying none of the call's secrets
    delivery.notifications_deliver_once()
    assert [rcpt for rcpt, _, _ in smtp.messages] == [["cy@support.example"]]
    _, mail, raw = smtp.messages[0]
    assert (
        mail["Subject"].startswith("Desk item moved") and "On-call" in (mail["Subject"])
    )
    assert f"/admin/console/takeoveritem/{task.pk}/change/" in mail.get_payload()
    assert [post["valid"] for post in receiver.posts] == [True]
    assert "Desk item moved" in receiver.posts[0]["body"]["text"]
    for sent in [raw, *receiver.raw]:
        assert SECRET.encode() not in sent and b"ana@example.com" not in sent

    # When a reviewer of the tenant opens it: no buttons, and a POST is refused
    make_person("rita", {desk.tenant: Role.REVIEWER}, password=PASSWORD)
    reviewer = browser.new_context().new_page()
    log_in(reviewer, live_server, "rita")
    reviewer.goto(item_url)
    reviewer.wait_for_selector("#desk-sla")
    assert reviewer.locator("#desk-take-over, #desk-reassign").count() == 0
    base = f"{live_server.url}/admin/console/takeoveritem/{task.pk}"
    assert _post_as_page(reviewer, f"{base}/take-over/").status == 403
    refused = _post_as_page(reviewer, f"{base}/reassign/", {"to": str(desk.group.pk)})
    assert refused.status == 403

    # and another tenant's administrator: no such item, and a POST is 404
    make_person("olga", {other_tenant: Role.ADMIN}, password=PASSWORD)
    outsider = browser.new_context().new_page()
    log_in(outsider, live_server, "olga")
    outsider.goto(item_url)
    assert "Perhaps it was deleted" in outsider.inner_text("body")
    assert outsider.locator("#desk-sla").count() == 0
    assert _post_as_page(outsider, f"{base}/take-over/").status == 404
    reassigned = _post_as_page(
        outsider, f"{base}/reassign/", {"to": str(desk.group.pk)}
    )
    assert reassigned.status == 404

    # Nothing changed after Ana's moves
    item.refresh_from_db()
    assert (item.group_id, item.person_id) == (desk.backup.pk, None)
    assert moves.count() == 2
