"""Every page under its Content-Security-Policy in Chromium, as each role: the header
is there and the page reports no violation (issue 19 §1). Swagger UI and Redoc still
render, and a 404 page carries the policy too."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse

from console import site as console_site
from portal import services as portal_services
from portal.models import Role, Tenant
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.csp import watch_violations
from tests.browser.shots import report_shot

pytestmark = pytest.mark.django_db(transaction=True)

STRICT = (
    "default-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
)


WORKERS = "/admin/workers/"


def _policy_of(response) -> str:
    policy = response.header_value("content-security-policy") or ""
    for directive in STRICT:
        assert directive in policy, (response.url, policy)
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    return policy


def _admin_pages(rows: dict) -> list[str]:
    """Each admin page's list and add page, and its change page for the row
    ``fill`` made."""
    # The dashboard and the workers page (console/site.py) are views of their own.
    urls = ["/admin/", WORKERS]
    for model in admin.site._registry:
        meta = model._meta
        urls.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        row = rows.get(model) or rows.get(getattr(meta, "proxy_for_model", None))
        if row is not None:
            urls.append(
                reverse(
                    f"admin:{meta.app_label}_{meta.model_name}_change", args=[row.pk]
                )
            )
        urls.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_add"))
    return urls


@pytest.mark.parametrize("role", [Role.REVIEWER, Role.SUPPORT, Role.ADMIN])
def test_every_admin_page_loads_under_the_policy_without_a_violation(
    page, live_server, tenant: Tenant, fill, role
):
    # Given a member of the tenant with one of each admin page's rows
    rows = fill(tenant)
    person = User.objects.create_user(f"csp-{role}", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=person, role=role)
    violations = watch_violations(page)

    # When they log in and open every page (a refused one answers 403: also a page)
    login = page.goto(f"{live_server.url}/admin/login/")
    _policy_of(login)
    log_in(page, live_server, person.username)
    statuses = {}
    for url in _admin_pages(rows):
        response = page.goto(f"{live_server.url}{url}")
        statuses[url] = response.status
        _policy_of(response)
        page.wait_for_load_state("load")

    # Then each carried the policy and none reported a violation
    assert violations == [], "\n".join(violations)
    assert sum(status == 200 for status in statuses.values()) >= 10, statuses
    assert all(status in (200, 403) for status in statuses.values()), statuses


def test_the_takeover_desk_works_under_the_policy(page, live_server, tenant, fill):
    rows = fill(tenant)
    person = User.objects.create_user("csp-desk", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=person, role=Role.SUPPORT)
    violations = watch_violations(page)
    log_in(page, live_server, "csp-desk")
    from tasks.models import Task

    task = rows[Task]
    _policy_of(page.goto(f"{live_server.url}/admin/console/takeoveritem/"))
    _policy_of(
        page.goto(f"{live_server.url}/admin/console/takeoveritem/{task.pk}/change/")
    )
    page.click("#desk-claim")
    page.wait_for_selector("#desk-claimed-by")
    # The desk's style sheet applies (it moved out of an inline block).
    assert (
        page.eval_on_selector(
            "#desk .desk-claimed", "e => getComputedStyle(e).fontWeight"
        )
        == "700"
    )
    assert violations == [], "\n".join(violations)


@pytest.mark.parametrize("who", ["operator", "tenant admin"])
def test_the_workers_page_refreshes_under_the_policy(
    page, live_server, tenant, monkeypatch, who
):
    """The workers page's live part is fetched again by console/live.js (same
    origin, no inline script): the fetch and the swap report no violation, for the
    operator's page (workers, queue, beat) and a tenant admin's (her outbox)."""
    monkeypatch.setattr(console_site, "WORKERS_REFRESH_S", 2)  # one refresh, soon
    if who == "operator":
        User.objects.create_superuser("csp-operator", password=PASSWORD)
        username = "csp-operator"
    else:
        person = User.objects.create_user(
            "csp-workers", password=PASSWORD, is_staff=True
        )
        portal_services.membership_grant(tenant=tenant, user=person, role=Role.ADMIN)
        username = "csp-workers"
    violations = watch_violations(page)
    log_in(page, live_server, username)
    response = page.goto(f"{live_server.url}{WORKERS}")
    assert response.status == 200
    _policy_of(response)
    page.wait_for_selector("#workers-live[data-refreshed-at]", timeout=20_000)
    assert page.locator("#workers-live.refresh-failed").count() == 0
    assert violations == [], "\n".join(violations)


def test_error_pages_carry_the_policy(page, live_server):
    violations = watch_violations(page)
    response = page.goto(f"{live_server.url}/no-such-page")
    assert response.status == 404
    _policy_of(response)
    assert violations == [], "\n".join(violations)


def test_swagger_ui_renders_under_the_policy(page, live_server):
    violations = watch_violations(page)

    response = page.goto(f"{live_server.url}/api/docs/")

    _policy_of(response)
    page.locator(".swagger-ui .opblock").first.wait_for()
    assert page.locator(".swagger-ui .opblock").count() >= 15
    page.locator(".swagger-ui .opblock-summary").first.click()  # opens an operation
    page.locator(".swagger-ui .opblock-body").first.wait_for()
    assert violations == [], "\n".join(violations)
    report_shot(page, "api-docs-csp.png")


def test_redoc_renders_under_the_policy(page, live_server):
    violations = watch_violations(page)

    response = page.goto(f"{live_server.url}/api/redoc/")

    policy = _policy_of(response)
    assert "'nonce-" in policy  # Redoc's start script and its style sheets
    page.locator("h1", has_text="Agent governance portal API").wait_for()
    assert page.get_by_text("contracts_list").count() >= 1
    page.wait_for_load_state("networkidle")
    # Redoc's styled-components sheets were applied: its menu is laid out.
    menu = page.locator(".menu-content")
    assert menu.evaluate("e => getComputedStyle(e).display") != "inline"
    assert violations == [], "\n".join(violations)
    report_shot(page, "api-redoc-csp.png")
