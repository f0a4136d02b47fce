"""The takeover desk's SLA clock in Chromium: the list's group / SLA column and the
item page's assignment line, for support staff (screenshots in reports/)."""

from __future__ import annotations

import re
import time

import pytest

from portal.models import Role
from routing import services as routing_services
from routing.models import Group, RoutingRule
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import report_shot
from tests.console.test_desk import escalate_task, make_person

pytestmark = pytest.mark.django_db(transaction=True)


def test_support_sees_the_group_and_the_clock_of_each_item(
    page, live_server, tenant, make_task, make_operation
):
    # Given one item past both deadlines of a fast rule, swept to the backup group
    billing = Group.objects.create(tenant=tenant, name="Billing")
    on_call = Group.objects.create(tenant=tenant, name="On-call")
    rule = RoutingRule.objects.create(
        tenant=tenant,
        reason_code="MULTIPLE_RECEIPTS",
        group=billing,
        backup_group=on_call,
        remind_after_s=1,
        escalate_after_s=2,
    )
    late = escalate_task(make_task, make_operation, tenant)
    time.sleep(2.5)
    assert routing_services.sla_sweep() == (0, 1)
    # and three fresh items under the usual rule (remind 10 min, escalate 30 min)
    rule.remind_after_s, rule.escalate_after_s = 600, 1800
    rule.save()
    for n in range(3):
        escalate_task(make_task, make_operation, tenant, n=2000 + n)
    make_person("sam", {tenant: Role.SUPPORT}, password=PASSWORD)
    page.set_viewport_size({"width": 1366, "height": 700})

    # When support opens the desk
    log_in(page, live_server, "sam")
    page.goto(f"{live_server.url}/admin/console/takeoveritem/")
    page.wait_for_selector("#result_list")
    listing = page.inner_text("#result_list")
    report_shot(page, "desk-sla-list.png", full_page=True)

    # Then each row names its group and its clock
    assert re.search(r"On-call: overdue by \d s \(reminded, escalated\)", listing)
    assert listing.count("Billing: due in 30 min") == 3

    # and the late item's page says who has it and since when it is overdue
    page.goto(f"{live_server.url}/admin/console/takeoveritem/{late.pk}/change/")
    page.wait_for_selector("#desk-sla")
    line = page.inner_text("#desk-sla")
    report_shot(page, "desk-sla-item.png")
    assert "Assigned to On-call" in line
    assert re.search(r"overdue by \d s \(was due at [-0-9]+ [:0-9]+ UTC\)", line)
    assert "reminded, escalated" in line
