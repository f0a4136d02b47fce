"""The README's demo, for real: ``manage.py up``, then the example agent against it.

``up`` runs as a subprocess on a scratch database of the test server (so the
embedded PostgreSQL is skipped), with its own ports, filesystem broker and var/
folder; the agent's tickets are counted by the ticket desk ``up`` started, and
Ctrl-C (SIGINT) must end everything ``up`` started.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, LiteralString

import httpx
import psutil
import psycopg
import pytest

from config.management.commands.seed_demo import USERS
from portal.models import Role
from tests.support.net import free_port
from tests.support.otlp import Receiver, Span, otlp_receiver
from tests.support.up import (
    REPO,
    STOP_TIMEOUT_S,
    alive,
    clean_env,
    running_up,
    scratch_database_url,
    wait_ready,
)

__all__ = ["scratch_database_url"]  # the fixture, from tests/support/up.py

SCRIPT = REPO / "examples" / "customer_issue_agent.py"
ISSUES = 3
# Whatever `up` must have started, by a word of its command line.
CHILDREN = ("ticketdesk", "gunicorn", "celery")
AGENT_TRACE = re.compile(r"customer-issue agent: \d+ issue\(s\), trace ([0-9a-f]{32})")
SPANS_TIMEOUT_S = 30.0

pytestmark = pytest.mark.slow


def _run_agent(portal: str, key: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, str(SCRIPT), "--base-url", portal, "--api-key", key,
        "--issues", str(ISSUES),
    ]  # fmt: skip
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )


def _logged_in_pages(
    portal: str, username: str, password: str, task_id: str
) -> tuple[str, str, str]:
    """The admin index, the takeover desk and one task's evidence page, as a person
    logged in through the login form (CSRF and all)."""
    with httpx.Client(base_url=portal, trust_env=False, timeout=30) as http:
        login = http.get("/admin/login/")
        token = http.cookies["csrftoken"]
        assert "csrfmiddlewaretoken" in login.text
        done = http.post(
            "/admin/login/?next=/admin/",
            data={
                "csrfmiddlewaretoken": token,
                "username": username,
                "password": password,
                "next": "/admin/",
            },
            headers={"Referer": f"{portal}/admin/login/"},
            follow_redirects=True,
        )
        assert done.status_code == 200 and done.url.path == "/admin/", username
        desk = http.get("/admin/console/takeoveritem/")
        evidence = http.get(f"/admin/console/takeoveritem/{task_id}/change/")
        assert desk.status_code == evidence.status_code == 200, username
        return done.text, desk.text, evidence.text


def _support_hands_back(env: dict[str, str], client_task_id: str) -> None:
    """The demo's support user claims the task and hands it back for a fresh read,
    through tasks.takeover (what the desk's Claim and Hand back buttons call)."""
    support = next(name for name, _, role in USERS if role == Role.SUPPORT)
    code = (
        "from django.contrib.auth.models import User\n"
        "from tasks import takeover\n"
        "from tasks.models import Task\n"
        f"person = User.objects.get(username={support!r})\n"
        f"task = Task.objects.get(client_task_id={client_task_id!r})\n"
        "takeover.task_human_claim(task=task, user=person)\n"
        "takeover.task_human_resolve(task=task, user=person,"
        " resolution='hand_back', note='read the e-mail again')\n"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _rows(database_url: str, query: LiteralString) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(query).fetchall()


def _one_trace(receiver: Receiver, trace_id: str) -> dict[str, Span]:
    """Wait for the demo's connected trace: web → gateway → desk, and a worker job.

    Returns the spans of ``trace_id`` by span id once the chain is there; fails with
    what arrived after SPANS_TIMEOUT_S.
    """
    deadline = time.monotonic() + SPANS_TIMEOUT_S
    while True:
        spans = {s.span_id: s for s in receiver.received() if s.trace_id == trace_id}

        def parent(span: Span, spans: dict[str, Span] = spans) -> Span | None:
            return spans.get(span.parent_span_id)

        desk_calls = [
            s
            for s in spans.values()
            if s.service == "ticketdesk"
            and s.name == "POST /tickets"
            and (client := parent(s)) is not None
            and client.service == "portal-web"
            and (tool := parent(client)) is not None
            and tool.name == "execute_tool create_ticket"
        ]
        worker_jobs = [
            s
            for s in spans.values()
            if s.service == "portal-worker"
            and (sent := parent(s)) is not None
            and sent.service == "portal-web"
        ]
        if desk_calls and worker_jobs:
            return spans
        if time.monotonic() > deadline:
            pytest.fail(
                f"no connected trace {trace_id} in {SPANS_TIMEOUT_S:.0f} s: "
                + repr(sorted((s.service, s.name) for s in spans.values()))
            )
        time.sleep(0.5)


def test_the_readme_demo_runs_end_to_end_and_stops_cleanly(
    scratch_database_url: str, tmp_path: Path
) -> None:
    with otlp_receiver() as receiver:
        _the_readme_demo(scratch_database_url, tmp_path, receiver)


def _the_readme_demo(
    scratch_database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    # Given: the README's start command, on a scratch database and free ports,
    # exporting its spans to a collector (docs/observability.md).
    port, desk_port = free_port(), free_port()
    portal = f"http://127.0.0.1:{port}"
    with running_up(
        scratch_database_url,
        tmp_path,
        port=port,
        PORTAL_TICKETDESK_PORT=str(desk_port),
        PORTAL_MCP_PORT=str(free_port()),  # up's MCP server (tests/mcp/test_up.py)
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="200",
    ) as up:
        process, env, pump = up.process, up.env, up.pump
        assert pump is not None
        key, desk = wait_ready(up, portal)
        assert desk == f"http://127.0.0.1:{desk_port}"
        children = psutil.Process(process.pid).children(recursive=True)
        commands = [" ".join(child.cmdline()) for child in children]
        for name in CHILDREN:
            assert any(name in command for command in commands), commands

        # When: the example agent runs against it, twice.
        first = _run_agent(portal, key)
        second = _run_agent(portal, key)

        # Then: the expected demo outcome (exit 0): N-1 tickets on the desk, made
        # once, and one issue in the takeover queue for a stale e-mail address.
        assert first.returncode == 0, first.stdout + first.stderr
        assert second.returncode == 0, second.stdout + second.stderr
        effects = httpx.get(f"{desk}/_control/effects", trust_env=False).json()
        assert effects["tickets_created"] == ISSUES - 1, effects
        assert f"issue-{ISSUES}: handed to a person: FIELD_STALE" in first.stdout
        assert f"issue-{ISSUES}: with a person (FIELD_STALE)" in second.stdout
        tasks = _rows(
            scratch_database_url,
            "SELECT client_task_id, state, reason_code FROM tasks_task "
            "ORDER BY client_task_id",
        )
        assert tasks == [
            *[(f"issue-{n}", "succeeded", None) for n in range(1, ISSUES)],
            (f"issue-{ISSUES}", "human_required", "FIELD_STALE"),
        ]

        # And: one trace from the agent's requests through the portal's web server
        # and the gateway's execute_tool spans to the ticket desk, and on to a job
        # on the Celery worker; the stored ids are the spans' own.
        trace_id = AGENT_TRACE.search(first.stdout)
        assert trace_id, first.stdout
        spans = _one_trace(receiver, trace_id[1])
        tools = [s for s in spans.values() if s.name.startswith("execute_tool ")]
        verdicts = sorted(
            (
                s.attributes["portal.gateway.verdict"],
                s.attributes.get("portal.gateway.reason_code", ""),
            )
            for s in tools
        )
        assert verdicts == [
            ("refused", "FIELD_STALE"),
            *[("verified", "")] * (ISSUES - 1),
        ], verdicts
        for tool in tools:
            assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
            assert tool.attributes["gen_ai.tool.name"] == "create_ticket"
        stored = _rows(
            scratch_database_url,
            "SELECT DISTINCT o.id::text, e.trace_id, e.span_id FROM audit_event e "
            "JOIN tasks_operation o ON o.id = e.operation_id "
            "WHERE e.code = 'gateway.checked'",
        )
        tool_ids = {
            (s.attributes["gen_ai.tool.call.id"], s.trace_id, s.span_id) for s in tools
        }
        assert tool_ids <= set(stored), (tool_ids, stored)
        assert _rows(
            scratch_database_url, "SELECT reason_code FROM tasks_escalation"
        ) == [("FIELD_STALE",)]

        # And: each README login lands on a useful portal with this demo's data.
        stale = _rows(  # issue-3, the last one
            scratch_database_url,
            "SELECT id::text FROM tasks_task ORDER BY client_task_id DESC LIMIT 1",
        )[0][0]
        for username, password, role in USERS:
            pages = _logged_in_pages(portal, username, password, stale)
            index, desk, evidence = pages
            assert "You don't have permission" not in index, username
            assert "Takeover queue" in index and "demo" in index, username
            assert f"issue-{ISSUES}" in desk, username  # the stale one waits there
            assert "FIELD_STALE" in evidence, username
            may_act = role in ("support", "admin")
            assert ('id="desk-claim"' in evidence) == may_act, username

        # When: support hands the stale issue back from the desk (the services the
        # desk's button calls, on up's database), and the agent runs twice more.
        _support_hands_back(env, f"issue-{ISSUES}")
        reruns = [_run_agent(portal, key) for _ in range(2)]

        # Then: the first makes the stale issue's ticket, and each run counts every
        # issue once, as what happened to it, and exits 0.
        for run in reruns:
            assert run.returncode == 0, run.stdout + run.stderr
            assert "FAILED" not in run.stdout, run.stdout
            assert (
                f"done: {ISSUES} ticket(s) (issue-{ISSUES} after a person), "
                "0 with a person (none), 0 failed"
            ) in run.stdout, run.stdout
        desk_effects = f"http://127.0.0.1:{desk_port}/_control/effects"
        effects = httpx.get(desk_effects, trust_env=False).json()
        assert effects["tickets_created"] == ISSUES, effects

        # When: Ctrl-C.
        process.send_signal(signal.SIGINT)
        returncode = process.wait(STOP_TIMEOUT_S)

        # Then: up exits 0 and nothing it started is left running.
        pump.join(10)
        assert returncode == 0, up.output()
        deadline = time.monotonic() + 10
        while (left := [c for c in children if alive(c)]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert not left, [" ".join(child.cmdline()) for child in left]

        # And: the demo's audit trail, signed, verifies (docs/audit-integrity.md).
        for command in ("checkpoint_audit", "verify_audit"):
            done = subprocess.run(
                [sys.executable, "manage.py", command],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        assert "ok tenant demo:" in done.stdout and "intact:" in done.stdout
