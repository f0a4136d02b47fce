"""Smoke test of bench/freeze.py at a tiny size: two agent processes against gunicorn
with two workers, a tenant administrator logged in through the admin's form clicks
freeze (the staff API), and the figures say what docs/limits.md records: nothing the
frozen agent sent after the click's answer was accepted, it was refused by name, and
the agent left running was never refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from audit.models import Event, EventCode
from bench import freeze as bench_freeze
from portal.models import Agent
from tests.http.conftest import Server, start, stop

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(django_db_setup: None, tmp_path: Path) -> Iterator[Server]:
    running = start(debug=False, log_path=tmp_path / "server.log", workers=2)
    try:
        yield running
    finally:
        stop(running)
    assert "Traceback" not in running.log(), running.log()[-5000:]


@pytest.mark.parametrize("what", ["agent", "tenant"])
def test_the_bench_measures_a_freeze_under_two_agent_processes(server, what):
    seeded = bench_freeze.seed(agents=2, run_id=f"t-{what}")

    figures = bench_freeze.measure(
        base_url=server.base_url,
        seeded=seeded,
        freeze=what,
        seconds=2.5,
        warmup=0.8,
    )

    assert (figures.agents, figures.freeze) == (2, what)
    assert figures.calls > 4 and figures.click_ms > 0
    assert figures.accepted_after_answer == 0
    assert figures.others_refused == 0
    assert figures.first_refused_ms > 0
    assert figures.last_accepted_ms < 1000
    frozen = Agent.objects.filter(pk__in=seeded.agent_ids, frozen_at__isnull=False)
    assert frozen.count() == (1 if what == "agent" else 0)
    # each refusal of a frozen caller is a denial event naming it
    assert Event.objects.filter(
        code=EventCode.GATEWAY_CHECKED,
        reason_code="AGENT_FROZEN" if what == "agent" else "TENANT_FROZEN",
        actor_id=seeded.agent_ids[0],
    ).exists()
