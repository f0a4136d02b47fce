"""Comments on a desk item in Chromium: support writes one under the timeline and
it joins the timeline at its place with his name; a tenant admin answers; a
reviewer reads both and has no form; another tenant's member reads neither."""

from __future__ import annotations

import pytest

from console.models import DeskComment
from portal.models import Role
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot
from tests.console.test_desk import escalate_task, make_person

pytestmark = pytest.mark.django_db(transaction=True)

DESK = "/admin/console/takeoveritem/"


def _comment(page, text: str) -> None:
    page.fill("#desk-comment", text)
    page.click("#desk-comment-submit")
    page.wait_for_selector("ul.messagelist")
    assert "Comment added to the timeline." in page.inner_text("ul.messagelist")


def test_people_comment_on_a_desk_item_and_only_its_tenant_reads_them(
    page, browser, live_server, tenant, other_tenant, make_task, make_operation
):
    task = escalate_task(make_task, make_operation, tenant, n=1042)
    item = f"{live_server.url}{DESK}{task.pk}/change/"
    make_person("sam", {tenant: Role.SUPPORT}, password=PASSWORD)
    make_person("ada", {tenant: Role.ADMIN}, password=PASSWORD)
    make_person("rita", {tenant: Role.REVIEWER}, password=PASSWORD)
    make_person("olga", {other_tenant: Role.ADMIN}, password=PASSWORD)

    # When Sam (support) comments on the item
    log_in(page, live_server, "sam")
    page.goto(item)
    _comment(page, "Called the customer: the refund is for order 77.")
    # Then his comment is the timeline's last row, with his name
    last = page.locator("#desk-events tbody tr").last
    assert "task.commented" in last.inner_text()
    assert "sam" in last.inner_text()
    assert "the refund is for order 77" in last.inner_text()

    # When Ada (tenant admin) answers
    admin = browser.new_context().new_page()
    log_in(admin, live_server, "ada")
    admin.goto(item)
    _comment(admin, "Thanks: hand it back once the ticket exists.")
    rows = admin.locator("#desk-events tbody tr", has_text="task.commented")
    assert rows.count() == 2
    assert "ada" in rows.nth(1).inner_text()  # oldest first: hers is second
    admin.set_viewport_size({"width": 1366, "height": 900})
    docs_shot(admin.locator("#desk-timeline"), "desk-comments.png")

    # A reviewer reads both and has no form
    reviewer = browser.new_context().new_page()
    log_in(reviewer, live_server, "rita")
    reviewer.goto(item)
    assert (
        reviewer.locator("#desk-events tbody tr", has_text="task.commented").count()
        == 2
    )
    assert reviewer.locator("#desk-comment-form").count() == 0

    # Another tenant's admin reads neither, on the item or the task's story
    outsider = browser.new_context().new_page()
    log_in(outsider, live_server, "olga")
    outsider.goto(item)
    assert "refund is for order 77" not in outsider.content()
    outsider.goto(f"{live_server.url}/admin/tasks/task/{task.pk}/change/")
    assert "refund is for order 77" not in outsider.content()
    assert DeskComment.objects.count() == 2
