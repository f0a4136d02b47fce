"""Smoke tests of bench/actions.py and bench/mcp_actions.py: every flow runs against
a live portal (and its MCP server) and the real desk, each action makes exactly one
ticket, and the figures are rates or latencies."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from bench import actions as bench_actions
from bench import mcp_actions as bench_mcp
from portal_client import PortalClient
from tasks.models import Task
from tests.mcp.conftest import start_http, stop
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


def test_the_mcp_bench_takes_the_action_through_both_doors_at_two_clients(
    portal_url: str, demo: Demo, desk: TicketDesk, tmp_path: Path
) -> None:
    """bench/mcp_actions.py: REST and MCP (``manage.py mcp --http``, the SDK's
    session) each take every action once, verified, one ticket each; the latencies
    are one sample per action."""
    server = start_http(
        tmp_path / "mcp.log",
        PORTAL_OUTBOUND_ALLOWED_HOSTS=urlsplit(desk.url).netloc,
    )
    try:
        rest, mcp = bench_mcp.measure(
            base_url=portal_url,
            mcp_url=server.url,
            secret=demo.secret,
            clients=2,
            actions=2,
            slice_size=1,
            run_id="t",
        )
    finally:
        stop(server)

    assert (rest.door, mcp.door) == ("rest", "mcp")
    assert len(rest.samples_ms) == len(mcp.samples_ms) == 4
    assert 0 < rest.p50 <= rest.p99
    assert 0 < mcp.p50 <= mcp.p99
    assert desk.effects()["tickets_created"] == 8
    assert desk.effects()["create_requests"] == 8
    assert set(
        Task.objects.filter(tenant=demo.tenant).values_list("state", flat=True)
    ) == {"succeeded"}
    assert "Traceback" not in server.log(), server.log()[-5000:]
