"""A real Chromium (Debian's package), driven by Playwright, against the live server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

# One row of every admin page's model in a tenant (tests/console/conftest.py).
from tests.console.conftest import fill  # noqa: F401

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# The flags a sandboxed, offline machine needs (see the env notes): no sandbox as
# root, no GPU, and none of Chromium's own calls home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="package")
def browser() -> Iterator[object]:
    """One Chromium for the whole browser tier (each test gets a fresh context);
    closed when the tier's last test is done."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(
                "Chromium is missing; .ci/run installs it (apt-get install chromium)"
            )
        pytest.skip(
            "Chromium is not installed: `apt-get install chromium` enables the browser "
            "tests (CI installs it)"
        )
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread, which
    # Django's async-safety check mistakes for async code; the tests' database
    # calls are synchronous, so the check is lifted while the browser lives.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser) -> Iterator[object]:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


PASSWORD = "pw-browser-tests-1"


def log_in(page, live_server, username: str, password: str = PASSWORD) -> None:
    """Through the admin's login form, as a person would."""
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
