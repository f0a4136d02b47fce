"""``portal_gateway_verdicts_total`` moves with each committed check verdict.

In one process (the live server is a thread of the test's): the counter is this
process's own. tests/http/test_observability.py covers the sums across processes.
"""

from __future__ import annotations

import pytest

from portal import metrics

from .conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def verdicts(check: str, verdict: str, reason: str = "") -> float:
    return metrics.GATEWAY_VERDICTS.labels(check, verdict, reason)._value.get()


def test_a_passed_run_counts_each_check_once(world: World) -> None:
    checks = ("contract", "fields", "target", "permission", "version", "credential")
    before = {check: verdicts(check, "passed") for check in checks}
    started = world.start_task()
    assert world.execute(started).json()["outcome"] == "verified"
    assert {
        check: verdicts(check, "passed") - before[check] for check in checks
    } == dict.fromkeys(checks, 1)
    # executing again reports the settled operation: no check runs, none is counted
    world.execute(started)
    assert verdicts("credential", "passed") - before["credential"] == 1


def test_a_refusal_counts_its_check_and_reason(world: World) -> None:
    before = verdicts("fields", "refused", "FIELD_MISSING")
    passed = verdicts("fields", "passed")
    started = world.start_task()
    answer = world.execute(started, world.fields(email=None))
    assert answer.json()["code"] == "FIELD_MISSING"
    assert verdicts("fields", "refused", "FIELD_MISSING") == before + 1
    assert verdicts("fields", "passed") == passed
