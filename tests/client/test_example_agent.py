"""The example agent (examples/customer_issue_agent.py) run as a program, twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from audit.models import Event
from portal import services as portal_services
from tasks.models import Operation, Task

from .conftest import AgentIdentity

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "customer_issue_agent.py"
ISSUES = 3


def run_agent(portal_url: str, api_key: str) -> subprocess.CompletedProcess[str]:
    # The portal runs inside this test process; the agent reaches it by URL only.
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--base-url",
            portal_url,
            "--api-key",
            api_key,
            "--issues",
            str(ISSUES),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
        check=False,
    )


def test_example_agent_turns_issues_into_tickets_once_however_often_it_runs(
    portal_url: str, identity: AgentIdentity
) -> None:
    # When: the agent runs.
    first = run_agent(portal_url, identity.secret)

    # Then: N tasks succeeded, each with one verified ticket.
    assert first.returncode == 0, first.stdout + first.stderr
    tasks = Task.objects.filter(tenant=identity.tenant)
    operations = Operation.objects.filter(tenant=identity.tenant)
    assert tasks.count() == ISSUES
    assert set(tasks.values_list("state", flat=True)) == {"succeeded"}
    assert sorted(operations.values_list("idempotency_key", "provider_reference")) == [
        (f"ticket-for-issue-{n}", f"TCK-{n}") for n in range(1, ISSUES + 1)
    ]
    assert set(operations.values_list("state", flat=True)) == {"verified"}
    for n in range(1, ISSUES + 1):
        assert f"issue-{n}: task " in first.stdout
        assert f"issue-{n}: ticket TCK-{n} verified" in first.stdout
    assert "task.transitioned" in first.stdout  # the printed audit trail
    events_after_first = Event.objects.filter(tenant=identity.tenant).count()

    # When: it runs again.
    second = run_agent(portal_url, identity.secret)

    # Then: it finds the same tasks and operations and changes nothing.
    assert second.returncode == 0, second.stdout + second.stderr
    assert tasks.count() == ISSUES
    assert operations.count() == ISSUES
    assert set(operations.values_list("state", flat=True)) == {"verified"}
    assert Event.objects.filter(tenant=identity.tenant).count() == events_after_first
    for n in range(1, ISSUES + 1):
        assert f"issue-{n}: already done; ticket TCK-{n}" in second.stdout
    assert "already registered" in second.stdout


def test_example_agent_exits_non_zero_on_a_bad_key(portal_url: str) -> None:
    result = run_agent(portal_url, "agp_nope.not-a-key")

    assert result.returncode == 1
    assert "UNAUTHENTICATED" in result.stdout


def test_example_agent_exits_non_zero_without_a_grant_and_hands_the_task_back(
    portal_url: str, identity: AgentIdentity
) -> None:
    # Given: an agent of the same tenant that may not create tickets.
    agent = portal_services.agent_create(tenant=identity.tenant, name="no-grants")
    secret = portal_services.agent_key_issue(agent=agent).secret

    result = run_agent(portal_url, secret)

    # Then: it fails loudly, and no task is left leased to it.
    assert result.returncode == 1
    assert "ACTION_NOT_GRANTED" in result.stdout
    assert "lease released" in result.stdout
    tasks = Task.objects.filter(tenant=identity.tenant)
    assert set(tasks.values_list("state", flat=True)) == {"pending"}
    assert not tasks.filter(lease_owner__isnull=False).exists()
    assert not Operation.objects.filter(tenant=identity.tenant).exists()
