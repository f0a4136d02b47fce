"""A member of tenant B, in Chromium, sees nothing of tenant A: not in any list, not
by typing A's ids into the address bar, not in the filters or the index."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from portal import services as portal_services
from portal.models import Role
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import report_shot
from tests.console.test_registry import scoped_admins

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_member_of_another_tenant_sees_nothing_of_it(
    page, live_server, make_tenant, fill
):
    # Given tenant A with a row on every admin page, and B's own admin
    tenant_a, tenant_b = make_tenant(slug="acme"), make_tenant(slug="bravo")
    rows_a = fill(tenant_a)
    fill(tenant_b)
    bea = User.objects.create_user("bea", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant_b, user=bea, role=Role.ADMIN)

    # When she logs in
    log_in(page, live_server, "bea")
    report_shot(page, "other-tenant-index.png", full_page=True)
    assert "acme" not in page.content()

    # Then no list page shows A's rows or offers A in its filters
    for model, _ in scoped_admins():
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        response = page.goto(f"{live_server.url}{url}")
        assert response is not None and response.status == 200, url
        html = page.content()
        assert "acme" not in html, url
        row = rows_a.get(model) or rows_a.get(meta.concrete_model)
        if row is not None:
            change = reverse(
                f"admin:{meta.app_label}_{meta.model_name}_change", args=[row.pk]
            )
            # A UUID is found as itself; a serial id ("85") is too short to look
            # for in a page, so its change link is looked for instead.
            marker = str(row.pk) if isinstance(row.pk, uuid.UUID) else change
            assert marker not in html, url
            # and A's row, asked for by id, is "not found", as a missing one is
            page.goto(f"{live_server.url}{change}")
            assert marker not in page.inner_text("#content"), change
            assert page.url.endswith("/admin/"), change  # redirected to the index
