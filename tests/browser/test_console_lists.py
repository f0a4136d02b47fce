"""The console's lists and messages as a tenant administrator reads them, in Chromium
(issue 24 §1): a message keeps an object's case ("walk-refund v1: published.", not
"Walk-refund v1 (draft): published."), list times carry seconds and the zone, the
outbox list keeps a long error inside its box at 1,400 px, and the connector list
links nowhere that 404s. Never a superuser; another tenant's administrator sees
none of these rows."""

from __future__ import annotations

import re

import pytest
from django.db.models.functions import Now

from audit.models import Outbox, OutboxState
from portal import services as portal_services
from portal.models import AgentKey, Role
from tasks import services as task_services
from tasks.models import Contract
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot, report_shot
from tests.console.test_desk import make_person
from tests.support.contracts import SPEC
from tests.support.outbound import allow as outbound_allow

pytestmark = pytest.mark.django_db(transaction=True)

SECONDS = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
LONG_ERROR = "broker unreachable: amqp://" + "x" * 400 + "/vhost"


def act(page, action: str, value: str) -> str:
    page.check(f"input[name=_selected_action][value='{value}']")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    return page.inner_text("ul.messagelist")


def test_a_tenant_admin_reads_messages_times_the_outbox_and_connectors(
    page, live_server, tenant, other_tenant, settings, monkeypatch
):
    # Given a tenant admin (not a superuser), a draft contract, a key and a connector
    ada = make_person("ada", {tenant: Role.ADMIN}, password=PASSWORD)
    assert not ada.is_superuser
    agent = portal_services.agent_create(tenant=tenant, name="triage-bot")
    key = portal_services.agent_key_issue(agent=agent).key
    draft = task_services.contract_create(tenant=tenant, key="walk-refund", spec=SPEC)
    assert draft.status == "draft"
    outbound_allow(settings, monkeypatch, "http://127.0.0.1:9")
    task_services.connector_save(
        tenant=tenant, target="ticket-desk", values={"base_url": "http://127.0.0.1:9"}
    )
    page.set_viewport_size({"width": 1400, "height": 900})
    log_in(page, live_server, "ada")

    # When she publishes the draft and revokes the key, the messages keep the case
    page.goto(f"{live_server.url}/admin/tasks/contract/")
    assert act(page, "publish_versions", str(draft.pk)) == "walk-refund v1: published."
    assert Contract.objects.get(pk=draft.pk).status == "published"
    page.goto(f"{live_server.url}/admin/portal/agentkey/")
    assert act(page, "revoke_keys", str(key.pk)) == f"{key.prefix}…: revoked."

    # and the lists show times to the second, with the zone
    for column in ("created_at", "revoked_at"):
        shown = page.inner_text(f"#result_list tbody tr td.field-{column}")
        assert SECONDS.fullmatch(shown.strip()), (column, shown)
    assert not re.search(r"[ap]\.m\.", page.inner_text("#result_list"))
    report_shot(page.locator("#changelist"), "agent-keys-times.png")

    # The contract form explains the spec with an example, and says where it breaks
    page.goto(f"{live_server.url}/admin/tasks/contract/add/")
    assert "required_fields" in page.inner_text("#spec-example")
    page.select_option("select[name=tenant]", str(tenant.pk))
    page.fill("input[name=key]", "refund")
    page.fill("textarea[name=spec]", '{"object_type": "x",\n "policy": }')
    page.click("input[name=_save]")
    errors = page.inner_text(".field-spec ul.errorlist")
    assert "not JSON: Expecting value at line 2, column 12" in errors, errors
    docs_shot(page.locator("#contract_form"), "contract-form.png")

    # The connector list shows its base URL as text: no link to the desk's root
    page.goto(f"{live_server.url}/admin/tasks/connector/")
    row = page.locator("#result_list tbody tr").first
    assert "http://127.0.0.1:9" in row.inner_text()
    hrefs = row.locator("a").evaluate_all("links => links.map(a => a.href)")
    assert hrefs and all("/admin/tasks/connector/" in href for href in hrefs), hrefs

    # The outbox list keeps a long unbroken error inside its box at 1,400 px
    row_id = Outbox.objects.filter(tenant=tenant).order_by("id").values("id")[:1]
    Outbox.objects.filter(pk__in=row_id).update(
        state=OutboxState.DEAD, attempts=8, last_error=LONG_ERROR
    )
    page.goto(f"{live_server.url}/admin/audit/outbox/?state__exact=dead")
    page.wait_for_selector("#result_list")
    widths = page.evaluate(
        """() => ({
            page: document.documentElement.scrollWidth,
            view: window.innerWidth,
            results: document.querySelector('#changelist .results').getBoundingClientRect().right,
            table: document.querySelector('#result_list').getBoundingClientRect().right,
            filter: document.querySelector('#changelist-filter').getBoundingClientRect().left,
        })"""
    )
    assert widths["page"] <= widths["view"], widths  # nothing cut off to the right
    assert widths["results"] <= widths["filter"], widths  # not under the filter
    # and the error is read whole, not cut at the box's edge (it wraps)
    assert widths["table"] <= widths["results"] + 1, widths
    assert SECONDS.search(page.inner_text("#result_list .field-created_at"))
    report_shot(page, "outbox-long-error.png", full_page=True)

    # and the whole list, sent rows with both their times, fits its box too (the
    # walk of issue 24: 855 px of table in a 751 px box hid 'sent at' and the error)
    Outbox.objects.filter(tenant=tenant).exclude(pk__in=row_id).update(
        state=OutboxState.SENT, attempts=1, sent_at=Now()
    )
    assert Outbox.objects.filter(tenant=tenant, state=OutboxState.SENT).exists()
    page.goto(f"{live_server.url}/admin/audit/outbox/")
    page.wait_for_selector("#result_list td.field-sent_at")
    fit = page.evaluate(
        """() => ({
            table: document.querySelector('#result_list').scrollWidth,
            box: document.querySelector('#changelist .results').clientWidth,
        })"""
    )
    assert fit["table"] <= fit["box"], fit
    assert SECONDS.search(page.inner_text("#result_list td.field-sent_at"))
    report_shot(page, "outbox-sent-rows.png", full_page=True)
    report_shot(page, "outbox-monitor-long-error.png", full_page=True)

    # Another tenant's administrator sees none of these rows
    page.context.clear_cookies()
    make_person("bob", {other_tenant: Role.ADMIN}, password=PASSWORD)
    log_in(page, live_server, "bob")
    for path in (
        "tasks/connector",
        "audit/outbox",
        "tasks/contract",
        "portal/agentkey",
    ):
        page.goto(f"{live_server.url}/admin/{path}/")
        text = page.inner_text("#content")
        assert "walk-refund" not in text and "127.0.0.1:9" not in text, path
        assert key.prefix not in text and "amqp://xxxx" not in text, path
    assert AgentKey.objects.get(pk=key.pk).revoked_at is not None
