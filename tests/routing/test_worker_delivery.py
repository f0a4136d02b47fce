"""A real Celery worker (python -m celery … worker) delivers the notifications to
the real SMTP server and webhook receiver; a second worker, started after the first
stopped, sends nothing again."""

from __future__ import annotations

import time
from typing import Any

import pytest

from routing.jobs import deliver_notifications_job
from routing.models import Notification
from tests.support.celery_worker import celery_worker_running
from tests.worker.conftest import subprocess_env

from .conftest import CANARY, escalate_with_canary

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_worker_delivers_and_a_restarted_one_sends_nothing_again(
    desk, smtp, receiver, make_task, make_operation, amqp_url, celery_test_queue,
    settings,
):  # fmt: skip
    # given a committed escalation with its two notifications
    escalate_with_canary(make_task, make_operation, desk.tenant)
    env = subprocess_env(
        amqp_url=amqp_url,
        exchange="portal.events.unused",
        CELERY_BROKER_URL=amqp_url,
        PORTAL_CELERY_QUEUE=celery_test_queue,
        PORTAL_EMAIL_HOST="127.0.0.1",
        PORTAL_EMAIL_PORT=str(settings.EMAIL_PORT),
    )

    # when a worker runs the delivery job
    with celery_worker_running(queue=celery_test_queue, env=env, name="notify") as w:
        deliver_notifications_job.apply_async(queue=celery_test_queue)
        wait_for(
            lambda: (
                not Notification.objects.filter(
                    tenant=desk.tenant, state="pending"
                ).exists()
            )
        )
    assert "deliver_notifications_job" in w.output()

    # then Ana's e-mail and the signed post arrived, without the canary
    assert [rcpt for rcpt, _, _ in smtp.messages] == [["ana@support.example"]]
    assert [post["valid"] for post in receiver.posts] == [True]
    assert all(CANARY.encode() not in raw for _, _, raw in smtp.messages)

    # when another worker starts and runs the job twice (a restart, a redelivery)
    with celery_worker_running(queue=celery_test_queue, env=env, name="again") as w2:
        deliver_notifications_job.apply_async(queue=celery_test_queue)
        deliver_notifications_job.apply_async(queue=celery_test_queue)
        wait_for(lambda: w2.output().count("succeeded") >= 2)

    # then nothing more was sent
    assert (len(smtp.messages), len(receiver.posts)) == (1, 1)
