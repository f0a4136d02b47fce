"""The workers page in Chromium, with a real Celery worker on RabbitMQ: the operator
sees the worker answer and a job's last run arrive by the page's own refresh; a
tenant administrator sees their outbox depth move; reviewer and support are
refused; another tenant's administrator sees only their own."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from audit.models import OutboxState
from portal import services as portal_services
from portal.models import Role
from tasks.jobs import reap_leases_job
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.shots import docs_shot
from tests.console.test_ops_outbox import make_row
from tests.support import broker
from tests.support.celery_worker import celery_worker_running
from tests.worker.conftest import subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

amqp_url = broker.amqp_url
celery_test_queue = broker.celery_test_queue
URL = "/admin/workers/"


def _post_as_page(page, url: str):
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    return page.request.post(
        url,
        form={"csrfmiddlewaretoken": token},
        headers={"Referer": page.url},
        max_redirects=0,
    )


def _member(username: str, tenant, role: str) -> User:
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=user, role=Role(role))
    return user


def test_the_operator_watches_a_live_worker_run_a_job(
    page, live_server, tenant, amqp_url, celery_test_queue
):
    # Given the operator and a worker on this test's queue
    User.objects.create_superuser("olivia", password=PASSWORD)
    make_row(tenant, state=OutboxState.DEAD)
    env = subprocess_env(
        amqp_url=amqp_url,
        exchange="portal.events.unused",
        CELERY_BROKER_URL=amqp_url,
        PORTAL_CELERY_QUEUE=celery_test_queue,
    )
    with celery_worker_running(
        queue=celery_test_queue, env=env, name="workerspage"
    ) as worker:
        log_in(page, live_server, "olivia")
        page.set_viewport_size({"width": 1366, "height": 900})
        # When she opens the page from the dashboard
        page.click("#to-workers")
        page.wait_for_url(f"{live_server.url}{URL}")
        # Then the worker answered, and the queue's depth is read
        row = page.locator("#workers-broker tr[data-worker^='workerspage-']")
        assert row.count() == 1
        assert "0 jobs waiting" in page.inner_text("#queue-depth")
        reap = page.locator("#workers-beat tr[data-entry='reap-leases']")
        assert "never" in reap.inner_text()

        # When the worker runs the lease reaper (as beat would send it)
        reap_leases_job.apply_async(queue=celery_test_queue)
        # Then the page, refreshing itself, shows its last run by that worker
        reap.filter(has_text="workerspage-").wait_for(timeout=60_000)
        assert "success" in reap.inner_text()
        assert "workerspage-" in worker.output()
        assert tenant.slug in page.inner_text("#workers-outbox")
        docs_shot(page, "workers-operator.png", full_page=True)

    # When the broker goes silent (nothing listens on its port) and she reloads
    with broker.closed_port() as port:
        broker.redirect_celery(
            broker_url=f"amqp://guest:guest@127.0.0.1:{port}//",
            queue=celery_test_queue,
        )
        page.reload()
        # Then the page says so instead of waiting, and keeps what the database knows
        assert "no answer in 1 s" in page.inner_text("#broker-silent")
        assert "success" in reap.inner_text()
        broker.redirect_celery(broker_url=amqp_url, queue=celery_test_queue)


def test_a_tenant_admin_sees_their_queue_depth_move(
    page, browser, live_server, tenant, other_tenant
):
    # Given a tenant admin of `tenant` and rows of another tenant
    _member("ada", tenant, Role.ADMIN)
    for _ in range(4):
        make_row(other_tenant, state=OutboxState.PENDING)
    log_in(page, live_server, "ada")
    page.set_viewport_size({"width": 1366, "height": 700})
    page.goto(f"{live_server.url}{URL}")
    pending = page.locator(
        f"#workers-outbox tr[data-tenant='{tenant.slug}'] td[data-pending]"
    )
    assert pending.inner_text() == "0"
    assert page.locator("#workers-broker, #workers-beat").count() == 0
    assert "platform operator" in page.inner_text("#operator-only")
    assert other_tenant.slug not in page.content()

    # When two events wait in her outbox
    make_row(tenant, state=OutboxState.PENDING)
    make_row(tenant, state=OutboxState.PENDING)
    # Then the page shows them without a reload
    page.wait_for_function(
        "sel => document.querySelector(sel).textContent.trim() === '2'",
        arg=f"#workers-outbox tr[data-tenant='{tenant.slug}'] td[data-pending]",
        timeout=60_000,
    )
    assert page.locator("#workers-live[data-refreshed-at]").count() == 1
    docs_shot(page, "workers-tenant-admin.png", full_page=True)
    assert _post_as_page(page, f"{live_server.url}{URL}").status == 405

    # And another tenant's administrator sees their own tenant only
    _member("olga", other_tenant, Role.ADMIN)
    outsider = browser.new_context().new_page()
    log_in(outsider, live_server, "olga")
    outsider.goto(f"{live_server.url}{URL}")
    assert (
        outsider.inner_text(
            f"#workers-outbox tr[data-tenant='{other_tenant.slug}'] td[data-pending]"
        )
        == "4"
    )
    assert tenant.slug not in outsider.content()


@pytest.mark.parametrize("role", [Role.REVIEWER, Role.SUPPORT])
def test_reviewer_and_support_are_refused(page, live_server, tenant, role):
    _member(f"{role}-w", tenant, role)
    log_in(page, live_server, f"{role}-w")
    assert page.locator("#to-workers").count() == 0
    response = page.goto(f"{live_server.url}{URL}")
    assert response is not None and response.status == 403
    assert _post_as_page(page, f"{live_server.url}{URL}").status == 403
