"""The workers page (/admin/workers/) per role, with a dead broker, and the job runs
it reads (portal/jobruns.py). A live worker on RabbitMQ and the page's refresh in
Chromium: tests/browser/test_workers_page.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from audit.models import OutboxState
from console import workers
from portal import jobruns
from portal.models import JobOutcome, JobRun
from tasks.jobs import reap_leases_job
from tests.support.broker import closed_port, redirect_celery

from .ops_people import logged_in, person
from .test_ops_outbox import make_row

pytestmark = pytest.mark.django_db
URL = "/admin/workers/"


@pytest.fixture
def dead_broker() -> Iterator[str]:
    """The Celery app pointed at a port that refuses every connection."""
    from config.celery import app

    saved = (app.conf.broker_url, app.conf.task_default_queue)
    with closed_port() as port:
        url = f"amqp://guest:guest@127.0.0.1:{port}//"
        redirect_celery(broker_url=url, queue="celery-dead")
        try:
            yield url
        finally:
            redirect_celery(broker_url=saved[0], queue=saved[1])


@pytest.fixture
def operator() -> User:
    return User.objects.create_superuser("operator-w", password="pw-operator-w-1")


@pytest.mark.parametrize("role", ["reviewer", "support", None])
def test_people_without_the_outbox_role_are_refused_reading_and_posting(tenant, role):
    # given a reviewer, a support person, staff of no tenant
    user = person(role, tenant) if role else person(None)
    client = logged_in(user)
    # then
    assert client.get(URL).status_code == 403
    assert client.post(URL, {}).status_code == 403


def test_a_tenant_admin_sees_their_outbox_only_and_no_workers(
    tenant, other_tenant, dead_broker
):
    # given pending rows in both tenants
    make_row(tenant, state=OutboxState.PENDING)
    make_row(tenant, state=OutboxState.DEAD)
    for _ in range(3):
        make_row(other_tenant, state=OutboxState.PENDING)
    admin = person("admin", tenant)
    # when
    response = logged_in(admin).get(URL)
    # then: their tenant's depth, nothing of the other, no broker, no beat
    assert response.status_code == 200
    page = response.context["page"]
    assert [(o.tenant.slug, o.pending.value, o.dead.value) for o in page.outbox] == [
        (tenant.slug, 1, 1)
    ]
    html = response.content.decode()
    assert other_tenant.slug not in html
    assert 'id="workers-broker"' not in html and 'id="workers-beat"' not in html
    assert 'id="operator-only"' in html
    assert page.broker is None  # the broker was never asked for them
    # and the page takes no change
    assert logged_in(admin).post(URL, {}).status_code == 405


def test_another_tenants_admin_sees_only_their_own(tenant, other_tenant):
    make_row(tenant, state=OutboxState.PENDING)
    response = logged_in(person("admin", other_tenant)).get(URL)
    assert [o.tenant.slug for o in response.context["page"].outbox] == [
        other_tenant.slug
    ]
    assert tenant.slug not in response.content.decode()


def test_the_operator_sees_a_dead_broker_said_not_waited_on(
    operator, tenant, dead_broker
):
    # given a job that ran (recorded by the job itself, as in a worker)
    reap_leases_job()
    # when the operator opens the page while the broker refuses connections
    response = logged_in(operator).get(URL)
    # then the page answers, says so, and shows what the database knows
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="broker-silent"' in html
    assert "no answer in 1 s" in html
    rows = {row.entry: row for row in response.context["page"].beat}
    assert rows["reap-leases"].outcome == JobOutcome.SUCCESS
    assert not rows["reap-leases"].late
    assert rows["apply-retention"].finished_at is None  # never ran here
    assert rows["apply-retention"].late
    assert tenant.slug in html  # the operator sees every tenant's outbox


def test_a_hung_broker_ask_is_cut_at_the_deadline():
    """A broker that never answers: the page gets "no answer" after the deadline,
    and asks beyond MAX_ASKING are refused at once instead of piling up threads."""
    import threading

    release = threading.Event()

    class Hung:
        class conf:
            task_default_queue = "q"

        def connection_for_read(self, **_: object) -> object:
            release.wait(30)
            raise ConnectionError("gone")

    hung = Hung()
    try:
        answers = [
            workers.broker_answer(app=hung, timeout_s=0.05)
            for _ in range(workers.MAX_ASKING + 1)
        ]
        assert [a.answered for a in answers] == [False] * (workers.MAX_ASKING + 1)
        assert [a.note for a in answers[: workers.MAX_ASKING]] == [
            "no answer in 0.05 s"
        ] * workers.MAX_ASKING
        assert "earlier asks still wait" in answers[-1].note
    finally:
        release.set()


def test_a_job_records_its_last_run_and_a_failure_with_its_error(db):
    from config.celery import app

    @app.task(name="tests.console.failing_job", bind=False)
    def failing_job() -> None:
        raise ValueError("no such operation")

    # when a job fails
    with pytest.raises(ValueError):
        failing_job()
    # then the failure is recorded with its error
    run = JobRun.objects.get(name="tests.console.failing_job")
    assert (run.outcome, run.error) == (
        JobOutcome.FAILURE,
        "ValueError: no such operation",
    )
    # and successes of one job are written at most once a second per process,
    # a failure always
    import time

    name = "tests.console.busy_job"
    jobruns._last_written.pop(name, None)
    started = time.monotonic()
    wrote = [
        jobruns.job_run_record(name=name, started=started, error=None),
        jobruns.job_run_record(name=name, started=started, error=None),
        jobruns.job_run_record(name=name, started=started, error=KeyError("x")),
    ]
    assert wrote == [True, False, True]
    assert JobRun.objects.get(name=name).outcome == JobOutcome.FAILURE
