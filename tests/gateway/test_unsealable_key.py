"""A connector key sealed under another server secret (issue 19, loose end 3).

With a changed ``PORTAL_REDACTION_SECRET`` (the key-encryption key of the sealed
connector keys) the settle job cannot mint the lookup credential of an operation
in doubt. Before, every run (every 10 s) logged an ``InvalidTag`` traceback and
left the operation as it was, forever. Now the failure is a stable error
(``CONNECTOR_KEY_UNSEALABLE``), logged once per connector per process; each look
counts as "cannot tell" with a ``receipt.queried`` event naming it (nothing is sent
to the desk); after ``PORTAL_RECOVERY_MAX_LOOKUPS`` the operation goes to a person
(``RESULT_UNKNOWN``), as any look that cannot tell. Real ticket desk on 127.0.0.1.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import connection

from audit.models import Event
from tasks import jobs
from tasks.exceptions import SealedValuesUnsealable
from tasks.models import Escalation, Operation, Task
from tests.gateway.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def queried(operation_id: str) -> list[dict[str, Any]]:
    return list(
        Event.objects.filter(operation_id=operation_id, code="receipt.queried")
        .order_by("id")
        .values_list("payload", flat=True)
    )


def test_a_changed_secret_is_said_once_and_the_operation_goes_to_a_person(
    world: World, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Given: an operation in doubt (the desk answered 503 to the call and to the
    # inline lookup), its next look due at once.
    settings.PORTAL_RECOVERY_BACKOFF_S = 0
    started = world.start_task()
    world.desk.set_fault("error_5xx", times=0)
    answer = world.execute(started)
    assert answer.json()["outcome"] == "unknown", answer.text
    world.desk.clear_faults()
    operation_id = started["operation"]["id"]
    operation = Operation.objects.get(pk=operation_id)
    assert (operation.state, operation.lookups) == ("unknown", 1)
    requests_before = world.desk.effects()["requests"]

    # When: the workers run with another server secret, and the settle job runs
    # until the budget is spent (and twice more).
    settings.PORTAL_REDACTION_SECRET = "another-secret-" + "x" * 32
    caplog.set_level(logging.INFO)
    runs = settings.PORTAL_RECOVERY_MAX_LOOKUPS + 2
    for _ in range(runs):
        jobs.check_receipts_job()

    # Then: the operation is a person's, with the reason in the evidence
    operation.refresh_from_db()
    assert operation.state == "human_required", operation.state
    assert operation.lookups == settings.PORTAL_RECOVERY_MAX_LOOKUPS
    task = Task.objects.get(pk=started["task"]["id"])
    assert task.state == "human_required"
    [escalation] = Escalation.objects.filter(operation_id=operation_id)
    assert escalation.reason_code == "RESULT_UNKNOWN"
    assert escalation.evidence["lookup_error"].startswith("CONNECTOR_KEY_UNSEALABLE")
    # and each look after the change is on the operation, naming the error
    looks = queried(operation_id)[1:]
    assert len(looks) == settings.PORTAL_RECOVERY_MAX_LOOKUPS - 1
    for look in looks:
        assert look["outcome"] == "unknown"
        assert look["error"] == (
            "CONNECTOR_KEY_UNSEALABLE: The connector's private key cannot be "
            "unsealed with this PORTAL_REDACTION_SECRET."
        )
    # and nothing reached the desk: no lookup, no call, no second ticket
    assert world.desk.effects()["requests"] == requests_before
    assert world.tickets() == 0
    # and the log says it once for the connector, without a traceback
    said = [r for r in caplog.records if "CONNECTOR_KEY_UNSEALABLE" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert str(world.connector.pk) in said[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], [
        r.getMessage() for r in caplog.records if r.exc_info
    ]


def test_an_execute_with_the_changed_secret_is_a_stable_error_and_sends_nothing(
    world: World, settings: Any
) -> None:
    # Given: a started task, and the web and workers with another server secret
    started = world.start_task()
    settings.PORTAL_REDACTION_SECRET = "another-secret-" + "y" * 32
    requests_before = world.desk.effects()["requests"]
    # When: the agent executes
    answer = world.execute(started)
    # Then: a problem with a stable code (the operation's sealed values are the
    # first thing it opens), no 500, nothing sent, nothing moved
    assert answer.status_code == SealedValuesUnsealable.status, answer.text
    assert answer.json()["code"] == "SEALED_VALUES_UNSEALABLE"
    assert world.desk.effects()["requests"] == requests_before
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert operation.state == "reserved"


def test_a_queued_run_under_the_changed_secret_is_said_once_and_sends_nothing(
    world: World, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Given: an execution queued (checked, sealed) under the right secret, whose
    # message was lost, so the settle job is the one to run it
    started = world.start_task()
    queued = world.http.post(
        f"/api/v1/operations/{started['operation']['id']}/execute",
        json={"field_values": world.fields()},
        headers={"Lease-Token": str(started["token"]), "Prefer": "respond-async"},
    )
    assert queued.status_code == 202, queued.text
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_operation SET next_check_at = app_now()")
    requests_before = world.desk.effects()["requests"]
    # When: the settle job runs three times with another secret
    settings.PORTAL_REDACTION_SECRET = "another-secret-" + "z" * 32
    caplog.set_level(logging.INFO)
    for _ in range(3):
        jobs.check_receipts_job()
    # Then: said once, without a traceback; nothing sent; the operation waits
    said = [r for r in caplog.records if "SEALED_VALUES_UNSEALABLE" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert started["operation"]["id"] in said[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]
    assert world.desk.effects()["requests"] == requests_before
    assert Operation.objects.get(pk=started["operation"]["id"]).state == "reserved"
