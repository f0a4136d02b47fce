"""The API docs pages (Swagger UI at /api/docs/, Redoc at /api/redoc/) load nothing
from any host but this server: every request Chromium makes from them is
intercepted, and one to any other host is refused and fails the test.

The pages' Content-Security-Policy would stop such a request before it reached the
network, where no route sees it: the browser here bypasses the policy, so what is
tested is what the pages ask for (tests/browser/test_csp.py tests the policy).
(These tests replace the offline ones of test_admin_dashboard.py, which let
Redoc ask Redocly's CDN for its logo.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.browser.shots import report_shot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def page(browser) -> Iterator[Any]:
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


def refuse_other_hosts(page) -> list[str]:
    """Route every request of ``page``: to 127.0.0.1 it goes on; to any other host
    it is aborted and listed in the answer (data: and blob: never reach a host)."""
    outside: list[str] = []

    def route(route) -> None:
        url = route.request.url
        if urlsplit(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    page.route("**/*", route)
    return outside


def local_url(live_server, path: str) -> str:
    # By address: the live server's own URL names localhost.
    return f"http://127.0.0.1:{live_server.thread.port}{path}"


def test_redoc_asks_no_other_host(page, live_server):
    outside = refuse_other_hosts(page)

    page.goto(local_url(live_server, "/api/redoc/"))

    page.locator("h1", has_text="Agent governance portal API").wait_for()
    assert page.get_by_text("contracts_list").count() >= 1
    # The menu's footer, where Redoc's bundle would show its maker's logo from
    # Redocly's CDN (console/redoc-start.js leaves it out), is on the page.
    page.get_by_text("API docs by Redocly").wait_for()
    page.wait_for_load_state("networkidle")
    assert outside == []
    report_shot(page, "api-redoc-offline.png")


def test_swagger_ui_asks_no_other_host(page, live_server):
    outside = refuse_other_hosts(page)

    page.goto(local_url(live_server, "/api/docs/"))

    page.locator(".swagger-ui .info .title").wait_for()
    assert "Agent governance portal API" in page.inner_text(".swagger-ui .info")
    page.locator(".swagger-ui .opblock").first.wait_for()
    assert page.locator(".swagger-ui .opblock").count() >= 15
    page.locator(".swagger-ui .opblock-summary").first.click()
    page.locator(".swagger-ui .opblock-body").first.wait_for()
    page.wait_for_load_state("networkidle")
    assert outside == []
    report_shot(page, "api-docs-offline.png")
