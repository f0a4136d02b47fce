"""Smoke test of bench/actions.py: both flows run against a live portal and the real
desk, each action makes exactly one ticket, and the figures are rates."""

from __future__ import annotations

from bench import actions as bench_actions
from portal_client import PortalClient
from tasks.models import Task
from ticketdesk.harness import TicketDesk

from .conftest import Demo


def test_the_bench_runs_both_flows_and_each_action_makes_one_ticket(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    with PortalClient(portal_url, demo.secret) as client:
        figures = bench_actions.measure(client, actions=3, slice_size=2, run_id="t")

    assert figures.actions == 3
    assert figures.one_call_per_s > 0
    assert figures.six_calls_per_s > 0
    assert desk.effects()["tickets_created"] == 6
    assert desk.effects()["create_requests"] == 6
    assert set(
        Task.objects.filter(tenant=demo.tenant).values_list("state", flat=True)
    ) == {"succeeded"}
