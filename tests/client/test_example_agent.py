"""The example agent (examples/customer_issue_agent.py) run as a program, twice,
against a live portal seeded by ``seed_demo`` and a real ticket desk, whose own
ledger is the evidence of how many tickets exist."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from django.core.management import call_command

from audit.models import Event
from portal import services as portal_services
from tasks.models import Escalation, Operation, Task
from ticketdesk.harness import TicketDesk

from .conftest import Demo

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "customer_issue_agent.py"
ISSUES = 3
STALE = ISSUES  # the agent's default: the last issue's e-mail is 10 minutes old


def run_agent(
    portal_url: str, api_key: str, *extra: str
) -> subprocess.CompletedProcess[str]:
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
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
        check=False,
    )


def test_example_agent_makes_tickets_once_and_hands_the_stale_issue_to_a_person(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    # When: the agent runs against the seeded portal.
    first = run_agent(portal_url, demo.secret)

    # Then: the planned outcome is a success (exit 0): N-1 tickets on the desk ...
    output = first.stdout + first.stderr
    assert first.returncode == 0, output
    effects = desk.effects()
    assert effects["tickets_created"] == ISSUES - 1, effects
    assert effects["by_idempotency_key"] == {
        f"ticket-for-issue-{n}": 1 for n in range(1, ISSUES)
    }
    tickets = {ticket["idempotency_key"]: ticket for ticket in desk.tickets()}
    assert tickets["ticket-for-issue-1"]["queue"] == "support_queue_a"
    assert tickets["ticket-for-issue-1"]["object"] == {
        "type": "customer_issue",
        "id": "1",
    }
    # ... only the contract's read field reached the desk ...
    assert tickets["ticket-for-issue-1"]["fields"] == {"email": "customer1@example.com"}
    # ... N-1 tasks succeeded, each with its verified operation and desk receipt ...
    tasks = Task.objects.filter(tenant=demo.tenant)
    operations = Operation.objects.filter(tenant=demo.tenant)
    assert tasks.count() == ISSUES
    assert set(tasks.values_list("contract_key", "contract_version")) == {
        ("customer-issue", 1)
    }
    for n in range(1, ISSUES):
        task = tasks.get(client_task_id=f"issue-{n}")
        operation = operations.get(task=task)
        assert task.state == "succeeded"
        assert operation.state == "verified"
        ticket_id = tickets[f"ticket-for-issue-{n}"]["ticket_id"]
        assert operation.provider_reference == ticket_id
        assert f"issue-{n}: ticket {ticket_id} verified" in first.stdout
    # ... and the stale one waits for a person, with an escalation and no ticket.
    stale = tasks.get(client_task_id=f"issue-{STALE}")
    assert (stale.state, stale.reason_code) == ("human_required", "FIELD_STALE")
    assert operations.get(task=stale).state == "human_required"
    escalation = Escalation.objects.get(task=stale)
    assert escalation.reason_code == "FIELD_STALE"
    assert escalation.resolved_at is None
    assert f"issue-{STALE}: handed to a person: FIELD_STALE" in first.stdout
    assert "takeover queue" in first.stdout
    assert "task.transitioned" in first.stdout  # the printed audit trail
    assert "fields: refused [FIELD_STALE]" in first.stdout
    assert (
        f"done: {ISSUES - 1} ticket(s), 1 with a person (issue-{STALE}), 0 failed"
        in first.stdout
    )
    events_after_first = Event.objects.filter(tenant=demo.tenant).count()

    # When: it runs again.
    second = run_agent(portal_url, demo.secret)

    # Then: it finds the same tasks and operations, and the desk makes no new ticket.
    assert second.returncode == 0, second.stdout + second.stderr
    assert desk.effects()["tickets_created"] == ISSUES - 1
    assert desk.effects()["create_requests"] == effects["create_requests"]
    assert tasks.count() == ISSUES
    assert operations.count() == ISSUES
    assert Escalation.objects.filter(tenant=demo.tenant).count() == 1
    assert Event.objects.filter(tenant=demo.tenant).count() == events_after_first
    for n in range(1, ISSUES):
        assert f"issue-{n}: already done; ticket TCK-" in second.stdout
    assert f"issue-{STALE}: with a person (FIELD_STALE); left alone" in second.stdout
    assert "issue-1: verified (task" in second.stdout
    assert ", found)" in second.stdout  # the same operation, not a new one

    # And: the demo's audit trail, once signed, verifies (docs/audit-integrity.md).
    call_command("checkpoint_audit", stdout=io.StringIO())
    verified = io.StringIO()
    call_command("verify_audit", tenant=demo.tenant.slug, stdout=verified)
    assert f"ok tenant {demo.tenant.slug}: {events_after_first} events" in (
        verified.getvalue()
    )


def test_example_agent_with_no_stale_issue_makes_every_ticket(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    result = run_agent(portal_url, demo.secret, "--stale-issue", "0")

    assert result.returncode == 0, result.stdout + result.stderr
    assert desk.effects()["tickets_created"] == ISSUES
    assert set(
        Task.objects.filter(tenant=demo.tenant).values_list("state", flat=True)
    ) == {"succeeded"}
    assert not Escalation.objects.filter(tenant=demo.tenant).exists()


def test_example_agent_exits_non_zero_on_a_bad_key(portal_url: str) -> None:
    result = run_agent(portal_url, "agp_nope.not-a-key")

    assert result.returncode == 1
    assert "UNAUTHENTICATED" in result.stdout


def test_example_agent_exits_non_zero_without_a_grant_and_writes_nothing(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    # Given: an agent of the demo tenant that may not create tickets.
    agent = portal_services.agent_create(tenant=demo.tenant, name="no-grants")
    secret = portal_services.agent_key_issue(agent=agent).secret

    result = run_agent(portal_url, secret)

    # Then: it fails loudly; the one call registered no task and made no ticket.
    assert result.returncode == 1
    assert "ACTION_NOT_GRANTED" in result.stdout
    assert not Task.objects.filter(tenant=demo.tenant).exists()
    assert desk.effects()["tickets_created"] == 0


def test_six_calls_agent_makes_the_same_tickets_once(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    first = run_agent(portal_url, demo.secret, "--six-calls")
    second = run_agent(portal_url, demo.secret)  # the one call finds its work

    assert first.returncode == 0, first.stdout + first.stderr
    assert second.returncode == 0, second.stdout + second.stderr
    assert "registered (pending)" in first.stdout  # the six-call path's own step
    assert desk.effects()["tickets_created"] == ISSUES - 1
    assert desk.effects()["create_requests"] == ISSUES - 1
    assert f"issue-{STALE}: with a person (FIELD_STALE); left alone" in second.stdout


def test_six_calls_agent_without_a_grant_hands_the_task_back(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    # Given: an agent of the demo tenant that may not create tickets.
    agent = portal_services.agent_create(tenant=demo.tenant, name="no-grants")
    secret = portal_services.agent_key_issue(agent=agent).secret

    result = run_agent(portal_url, secret, "--six-calls")

    # Then: it fails loudly, no task is left leased to it, and no ticket exists.
    assert result.returncode == 1
    assert "ACTION_NOT_GRANTED" in result.stdout
    assert "lease released" in result.stdout
    tasks = Task.objects.filter(tenant=demo.tenant)
    assert set(tasks.values_list("state", flat=True)) == {"pending"}
    assert not tasks.filter(lease_owner__isnull=False).exists()
    assert not Operation.objects.filter(tenant=demo.tenant).exists()
    assert desk.effects()["tickets_created"] == 0


# Every way of running the agent again once a person settled the stale issue: the
# default run, one that declares no issue stale, and the six-call lifecycle.
RERUNS = ((), (), ("--stale-issue", "0"), ("--six-calls",), ("--six-calls",))


def assert_every_rerun_says(portal_url: str, secret: str, summary: str) -> None:
    """Each later run exits 0 and counts each issue once, as what happened."""
    for extra in RERUNS:
        run = run_agent(portal_url, secret, *extra)
        assert run.returncode == 0, (extra, run.stdout + run.stderr)
        assert "FAILED" not in run.stdout, (extra, run.stdout)
        assert summary in run.stdout, (extra, run.stdout)


def _support_claims_the_stale_task(demo: Demo):
    from django.contrib.auth.models import User

    from portal.models import Role
    from tasks import takeover

    person = User.objects.create_user("sam", password="pw-for-tests-only-1")
    portal_services.membership_grant(tenant=demo.tenant, user=person, role=Role.SUPPORT)
    task = Task.objects.get(tenant=demo.tenant, client_task_id=f"issue-{STALE}")
    takeover.task_human_claim(task=task, user=person)
    return person, task


def test_a_person_hands_the_stale_issue_back_and_the_next_run_makes_its_ticket(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    from tasks import takeover

    assert run_agent(portal_url, demo.secret).returncode == 0
    person, task = _support_claims_the_stale_task(demo)
    takeover.task_human_resolve(
        task=task, user=person, resolution="hand_back", note="read the e-mail again"
    )

    again = run_agent(portal_url, demo.secret)

    assert again.returncode == 0, again.stdout + again.stderr
    assert f"issue-{STALE}: known from an earlier run; reading the fields again" in (
        again.stdout
    )
    assert desk.effects()["by_idempotency_key"][f"ticket-for-issue-{STALE}"] == 1
    assert Task.objects.get(pk=task.pk).state == "succeeded"
    after_person = (
        f"done: {ISSUES} ticket(s) (issue-{STALE} after a person), "
        "0 with a person (none), 0 failed"
    )
    assert after_person in again.stdout
    assert_every_rerun_says(portal_url, demo.secret, after_person)
    assert desk.effects()["tickets_created"] == ISSUES


def test_a_person_gives_the_fresh_email_and_the_next_run_finishes_the_task(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    from portal.db import db_now
    from tasks import takeover
    from tasks.gateway import FieldValue

    assert run_agent(portal_url, demo.secret).returncode == 0
    person, task = _support_claims_the_stale_task(demo)
    operation = Operation.objects.get(task=task)
    edited = takeover.task_human_edit(
        task=task,
        user=person,
        operation_id=operation.pk,
        fields=[
            FieldValue(
                name="email",
                value=f"customer{STALE}@example.com",
                source="crm",
                observed_at=db_now(),
            ),
            FieldValue(
                name="plan", value="pro", source="billing", observed_at=db_now()
            ),
        ],
    )
    assert edited.result.outcome == "verified"

    again = run_agent(portal_url, demo.secret)

    assert again.returncode == 0, again.stdout + again.stderr
    assert desk.effects()["by_idempotency_key"][f"ticket-for-issue-{STALE}"] == 1
    assert Task.objects.get(pk=task.pk).state == "succeeded"
    assert_every_rerun_says(
        portal_url,
        demo.secret,
        f"done: {ISSUES} ticket(s) (issue-{STALE} after a person), "
        "0 with a person (none), 0 failed",
    )
    assert desk.effects()["tickets_created"] == ISSUES


def test_a_cancelled_issue_is_settled_by_a_person_not_a_failure(
    portal_url: str, demo: Demo, desk: TicketDesk
) -> None:
    from tasks import takeover

    assert run_agent(portal_url, demo.secret).returncode == 0
    person, task = _support_claims_the_stale_task(demo)
    takeover.task_human_resolve(
        task=task, user=person, resolution="cancel", note="duplicate issue"
    )

    again = run_agent(portal_url, demo.secret)

    assert again.returncode == 0, again.stdout + again.stderr
    assert f"issue-{STALE}: settled by a person (cancelled)" in again.stdout
    assert "FAILED" not in again.stdout
    assert desk.effects()["tickets_created"] == ISSUES - 1
    assert_every_rerun_says(
        portal_url,
        demo.secret,
        f"done: {ISSUES - 1} ticket(s), "
        f"1 with a person (issue-{STALE} cancelled by a person), 0 failed",
    )
    assert desk.effects()["tickets_created"] == ISSUES - 1
