"""The operator makes a second tenant with ``manage.py tenant_create``; its new
administrator logs in, in Chromium, with the password the command printed once, and
sees their own tenant and nothing of the other one."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from django.urls import reverse

from tests.browser.conftest import log_in
from tests.browser.shots import report_shot

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_new_administrator_logs_in_and_sees_only_their_tenant(
    page, live_server, make_tenant, fill
):
    # Given a tenant with a row on every admin page
    demo = make_tenant(slug="demo-co")
    fill(demo)

    # When the operator makes a second tenant and its administrator
    out = io.StringIO()
    call_command(
        "tenant_create", "acme", "--name", "Acme Ltd", "--admin", "ada", stdout=out
    )
    printed = re.search(r"password for 'ada': (\S+) \(shown once", out.getvalue())
    assert printed, out.getvalue()

    # Then she logs in with that password and her tenant is the only one she sees
    log_in(page, live_server, "ada", printed[1])
    assert "Acme Ltd" in page.content() or "acme" in page.content()
    page.goto(f"{live_server.url}{reverse('admin:portal_tenant_changelist')}")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "acme" in rows.first.inner_text()
    report_shot(page, "tenant-create-admin.png", full_page=True)
    for name in ("task", "agent", "contract", "connector", "membership"):
        app = "portal" if name in ("agent", "membership") else "tasks"
        page.goto(f"{live_server.url}{reverse(f'admin:{app}_{name}_changelist')}")
        assert "demo-co" not in page.content(), name
    # And she may add her tenant's agents (a tenant administrator's page)
    response = page.goto(f"{live_server.url}{reverse('admin:portal_agent_add')}")
    assert response is not None and response.status == 200
