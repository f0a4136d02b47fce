"""Example agent: each confirmed customer issue becomes one support ticket.

The seed's worked example ("客户问题转工单"), run against the portal that
``python3 manage.py up`` starts (it seeds the contract, the agent's grant and the
ticket desk this needs, and prints the agent's key)::

    .venv/bin/python examples/customer_issue_agent.py \\
        --base-url http://127.0.0.1:8000 --api-key agp_... --issues 3

For each issue ``n`` the agent records the issue's version (``7``) and takes the
action in one call (``POST /api/v1/actions``, ``PortalClient.take_action``):
``create_ticket`` on ``ticket-desk`` under the business key ``ticket-for-issue-<n>``,
for the object it read, with the fields it read: the customer's e-mail (from the
CRM) and plan (from billing), each with the time it was read. The portal registers
the task ``issue-<n>`` pinned to the contract ``customer-issue``, leases it, reserves
the operation, and its gateway checks the fields against the contract, calls the
ticket desk once and verifies the receipt (the ticket id); the task is then
``succeeded``. The agent prints each answer and the audit trails.

``--six-calls`` runs the same work as the step-by-step lifecycle instead: register
the task, lease it, move it to ``running``, reserve the operation, execute it
through the gateway, move the task to ``succeeded`` (for agents that hold a task
across several actions, or execute on targets without a connector).

One case goes to a person on purpose: the last issue's e-mail address was read ten
minutes ago, longer than the contract's 300 s. The gateway refuses it
(``FIELD_STALE``), no ticket is made, and the task waits in the takeover queue
(``/api/v1/takeover/queue``; the admin's Takeover desk) for support staff. That
is the demo's expected outcome, so it does not fail the run. ``--stale-issue 0``
makes every issue fresh. Only the first read is old: once the portal knows the
issue (a later run), the agent reads the e-mail again.

What the person does decides the next run. *Hand back* puts the task back in the
queue for a fresh read: the next run finds its operation waiting for a person,
reads the e-mail again and executes under the same key, and the ticket is made.
*Edit* (the person gives the fresh e-mail) makes the ticket at once; the next run
finds it verified and finishes the task. *Cancel* ends the issue with the person's
decision; the agent reports it as settled by a person, not as a failure. Whenever
the agent finds an issue already finished, it reads the task's trail to say whether
a person settled it.

Safe to run again, and to re-run after a crash: every step is keyed, so a second
run finds the same tasks and operations, makes no second ticket (the desk's own
count shows it) and leaves the issue that is with a person alone.

The last line counts each issue once, as what happened to it on this run:
``done: 2 ticket(s), 1 with a person (issue-3), 0 failed``; a ticket made after a
person stepped in, or an issue a person cancelled, is named with it. Exit status:
0 when every issue has its verified ticket or is with a person (waiting, or settled
by them); 1 when any failed (the agent could not finish it and no person has it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Final

from customer_issues import (
    OBJECT_TYPE,
    OBJECT_VERSION,
    CustomerIssue,
    Tally,
    add_issue_arguments,
    check_issue_arguments,
    demo_issues,
    say,
)

from portal_client import (
    ActionResult,
    FieldRead,
    FieldValue,
    GatewayRefused,
    LeaseHeld,
    LeaseKeeper,
    LeaseLost,
    Operation,
    PortalClient,
    PortalError,
    PortalUnavailable,
    Task,
    Unauthenticated,
)

WORKFLOW_KEY: Final = "customer-issue"
WORKFLOW_VERSION: Final = "1"
CONTRACT_KEY: Final = "customer-issue"
ACTION: Final = "create_ticket"
TARGET: Final = "ticket-desk"
LEASE_TTL_S: Final = 30
# How long to wait for the portal's recovery to settle an answer in doubt.
SETTLE_TIMEOUT_S: Final = 20.0
SETTLED: Final = frozenset({"verified", "failed", "conflict", "human_required"})
WITH_A_PERSON: Final = frozenset({"human_required", "human_claimed"})
ENDED_BY_A_PERSON: Final = frozenset({"cancelled", "failed"})


class AgentFailure(Exception):
    """The issue cannot be finished automatically; a person has to look."""


class HandedToPerson(Exception):
    """The portal put the task in the takeover queue; a person takes it from here."""

    def __init__(self, reason: str, escalation_id: str | None = None) -> None:
        self.reason = reason
        self.escalation_id = escalation_id
        super().__init__(reason)


def field_reads(issue: CustomerIssue, now: dt.datetime) -> dict[str, FieldRead]:
    """What the agent read, where from, and when, by field name."""
    return {
        name: FieldRead(value=value, source=source, read_at=read_at)
        for name, (value, source, read_at) in issue.reads(now).items()
    }


def field_values(issue: CustomerIssue, now: dt.datetime) -> list[FieldValue]:
    """What the agent read, where from, and when."""
    return [
        FieldValue(name=name, value=value, source=source, observed_at=read_at)
        for name, (value, source, read_at) in issue.reads(now).items()
    ]


def resolved_by_person(client: PortalClient, task_id: str) -> bool:
    """Whether a person settled or handed back this task (its trail says so)."""
    return any(
        event.code == "task.resolved" and event.actor_type == "user"
        for event in client.list_events(task_id)
    )


class _Agent:
    """What both ways of working share: the client, the tally, the trails."""

    def __init__(self, client: PortalClient, *, owner: str, tally: Tally) -> None:
        self.client = client
        self.owner = owner
        self.tally = tally
        self.task_ids: dict[str, str] = {}  # client task id -> task id, for reports

    def handle(self, issue: CustomerIssue) -> None:
        raise NotImplementedError

    def print_events(self, task_id: str, name: str) -> None:
        print_events(self.client, task_id, name)


class OneCallAgent(_Agent):
    """Each issue is one ``take_action`` call; the portal does the lifecycle."""

    def handle(self, issue: CustomerIssue) -> None:
        """Take the issue's action; report and tally what the portal answered.

        A ticket when it is verified (now or by an earlier run; the trail says
        whether a person stepped in), with a person when the task waits for one or
        a person ended it.

        Raises:
            AgentFailure: the issue cannot be finished automatically.
            PortalError: the portal refused the request itself (no grant, ...).
        """
        name = issue.name
        self.client.record_object_version(
            OBJECT_TYPE, str(issue.number), version=OBJECT_VERSION
        )
        if issue.stale and self._known(issue):
            # The portal has this issue from an earlier run: read the e-mail again.
            say(f"{name}: known from an earlier run; reading the fields again")
            issue = dataclasses.replace(issue, email_age=dt.timedelta(0))
        elif issue.stale:
            say(
                f"{name}: e-mail read {issue.email_age.total_seconds():.0f} s ago "
                "(the contract allows 300 s): expect the gateway to refuse"
            )
        answer = self._take(issue)
        self.task_ids[name] = answer.task_id
        say(
            f"{name}: {answer.status} (task {answer.task_id} {answer.task_state}, "
            f"operation {answer.operation_id} {answer.operation_state}, "
            f"{'new' if answer.created else 'found'})"
        )
        if answer.status == "unknown":
            answer = self._settle(issue, answer)
        if answer.status == "verified":
            if not answer.created:
                say(f"{name}: already done; ticket {answer.provider_reference}")
            else:
                say(f"{name}: ticket {answer.provider_reference} verified")
            by_person = resolved_by_person(self.client, answer.task_id)
            self.tally.ticket(name, after_person=by_person)
            return
        if answer.status in ("refused", "human_required"):
            if answer.created:  # refused in this run
                say(
                    f"{name}: handed to a person: {answer.reason_code} "
                    f"(desk item {answer.desk_item_id}); it waits in the takeover "
                    "queue"
                )
            else:
                say(f"{name}: with a person ({answer.reason_code}); left alone")
            self.tally.person(name)
            return
        if answer.status == "failed" and resolved_by_person(
            self.client, answer.task_id
        ):
            say(f"{name}: settled by a person ({answer.task_state}); nothing to do")
            self.tally.person(name, settled=answer.task_state)
            return
        raise AgentFailure(f"{name}: {answer.status}: {answer.next_step}")

    def _take(self, issue: CustomerIssue) -> ActionResult:
        return self.client.take_action(
            action=ACTION,
            target=TARGET,
            object_type=OBJECT_TYPE,
            object_id=str(issue.number),
            object_version=OBJECT_VERSION,
            # Read "now": a real agent would stamp each value as it reads it.
            fields=field_reads(issue, dt.datetime.now(dt.UTC)),
            arguments=issue.ticket_input,
            idempotency_key=issue.ticket_key,
            contract_key=CONTRACT_KEY,
            workflow_key=WORKFLOW_KEY,
            workflow_version=WORKFLOW_VERSION,
            client_task_id=issue.name,
        )

    def _known(self, issue: CustomerIssue) -> bool:
        """Whether the portal holds a task for this issue already (one read)."""
        page = self.client.list_tasks_page(
            object_type=OBJECT_TYPE, object_id=str(issue.number), page_size=1
        )
        return bool(page.items)

    def _settle(self, issue: CustomerIssue, answer: ActionResult) -> ActionResult:
        """The result is in doubt: repeat the same call until the portal knows.

        The portal, not this agent, finds out whether the ticket exists (it looks
        the receipt up by key); repeating the call never calls the desk again.
        """
        name = issue.name
        say(f"{name}: result in doubt; the portal looks the receipt up")
        give_up_at = time.monotonic() + SETTLE_TIMEOUT_S
        while not answer.settled:
            if time.monotonic() > give_up_at:
                raise AgentFailure(
                    f"{name}: still {answer.status} after {SETTLE_TIMEOUT_S:.0f} s; "
                    "the portal keeps looking, run again later"
                )
            time.sleep(1)
            answer = self._take(issue)
        return answer


class CustomerIssueAgent(_Agent):
    """The six-call lifecycle (``--six-calls``): each step is its own request."""

    def handle(self, issue: CustomerIssue) -> None:
        """Bring one issue to a verified ticket, or leave it with a person; tally it.

        Raises:
            AgentFailure: the issue cannot be finished automatically.
            LeaseLost: the lease went away mid-work; a later run resumes.
            PortalError: the portal refused a step.
        """
        name = issue.name
        self.client.record_object_version(
            OBJECT_TYPE, str(issue.number), version=OBJECT_VERSION
        )
        task, created = self.client.register_task(
            client_task_id=name,
            workflow_key=WORKFLOW_KEY,
            workflow_version=WORKFLOW_VERSION,
            object_type=OBJECT_TYPE,
            object_id=str(issue.number),
            object_version=OBJECT_VERSION,
            contract_key=CONTRACT_KEY,
        )
        self.task_ids[name] = task.id
        say(
            f"{name}: task {task.id} "
            f"{'registered' if created else 'already registered'} ({task.state})"
        )
        if task.state == "succeeded":
            self._already_done(task, issue)
            return
        if task.state in WITH_A_PERSON:
            say(f"{name}: with a person ({task.reason_code}); left alone")
            self.tally.person(name)
            return
        if task.state in ENDED_BY_A_PERSON and resolved_by_person(self.client, task.id):
            say(f"{name}: settled by a person ({task.state}); nothing left to do")
            self.tally.person(name, settled=task.state)
            return
        if task.state not in ("pending", "running"):
            raise AgentFailure(f"{name}: task is {task.state}")

        task = self._claim(task)
        say(f"{name}: claimed by {self.owner} (lease token {task.lease.token})")
        try:
            with LeaseKeeper(
                self.client, task.id, task.lease.token, LEASE_TTL_S
            ) as keeper:
                operation = self._reserve(task, issue, lease_token=keeper.token)
                if operation.state == "human_required":
                    # A person handed the task back: what was read before was
                    # refused, so read every field again before executing.
                    say(f"{name}: handed back by a person; reading the fields again")
                    issue = dataclasses.replace(issue, email_age=dt.timedelta(0))
                keeper.check()  # the last moment to stop before the side effect
                ticket = self._execute(operation, issue, keeper)
                keeper.check()
                task = self.client.transition(
                    task.id,
                    to="succeeded",
                    expected_state_version=task.state_version,
                    lease_token=keeper.token,
                    step="ticket_created",
                    payload={"ticket": ticket},
                )
        except HandedToPerson as handed:
            # The portal revoked the lease and opened an escalation: nothing to
            # hand back, and nothing more this agent may write for the issue.
            say(
                f"{name}: handed to a person: {handed.reason} "
                f"(escalation {handed.escalation_id}); it waits in the takeover queue"
            )
            self.tally.person(name)
            return
        except (AgentFailure, LeaseLost, PortalError):
            self._hand_back(task)
            raise
        say(f"{name}: task {task.state} (state version {task.state_version})")
        self.tally.ticket(name, after_person=resolved_by_person(self.client, task.id))

    def _already_done(self, task: Task, issue: CustomerIssue) -> None:
        """The task succeeded on an earlier run (or a person completed it)."""
        name = issue.name
        # Finished by an earlier run: the same reservation answers the stored
        # operation (no lease needed to read back an existing reservation).
        operation = self._reserve(task, issue, lease_token=task.lease.token)
        by_person = resolved_by_person(self.client, task.id)
        if operation.state == "verified" and operation.provider_reference:
            say(
                f"{name}: already done; ticket {operation.provider_reference} "
                f"(operation {operation.id} {operation.state})"
            )
            self.tally.ticket(name, after_person=by_person)
        elif by_person:
            say(f"{name}: settled by a person (operation {operation.state})")
            self.tally.person(name, settled="completed")
        else:
            raise AgentFailure(
                f"{name}: task succeeded, but its operation is {operation.state}"
            )

    def _claim(self, task: Task) -> Task:
        """Lease this very task (not claim-next: the tenant may hold other work)."""
        give_up_at = time.monotonic() + LEASE_TTL_S + 5
        while True:
            try:
                leased = self.client.acquire_lease(
                    task.id, owner=self.owner, ttl_s=LEASE_TTL_S
                )
                break
            except LeaseHeld:
                # Most likely a run that crashed: its lease lapses within the TTL.
                if time.monotonic() > give_up_at:
                    raise
                say(f"{task.client_task_id}: lease held elsewhere; waiting for it")
                time.sleep(2)
        if leased.state == "pending":
            leased = self.client.transition(
                leased.id,
                to="running",
                expected_state_version=leased.state_version,
                lease_token=leased.lease.token,
                step="claimed",
            )
        return leased

    def _hand_back(self, task: Task) -> None:
        """Release the lease after a failure, so a re-run need not wait out its TTL."""
        try:
            self.client.release_lease(task.id, lease_token=task.lease.token)
        except PortalError:
            pass  # already lost or taken over: nothing to hand back
        else:
            say(f"{task.client_task_id}: lease released; the task is pending again")

    def _reserve(
        self, task: Task, issue: CustomerIssue, *, lease_token: int
    ) -> Operation:
        operation, created = self.client.reserve_operation(
            task.id,
            lease_token=lease_token,
            idempotency_key=issue.ticket_key,
            action=ACTION,
            target=TARGET,
            input=issue.ticket_input,
        )
        say(
            f"{issue.name}: operation {operation.id} "
            f"{'reserved' if created else 'found'} "
            f"(key {operation.idempotency_key}, {operation.state})"
        )
        return operation

    def _execute(
        self, operation: Operation, issue: CustomerIssue, keeper: LeaseKeeper
    ) -> str:
        """Execute through the gateway (or find the earlier attempt's result).

        Raises:
            HandedToPerson: the gateway refused, or the result needs a person.
            AgentFailure: the ticket desk refused the ticket.
        """
        name = issue.name
        if issue.stale:
            say(
                f"{name}: e-mail read {issue.email_age.total_seconds():.0f} s ago "
                "(the contract allows 300 s): expect the gateway to refuse"
            )
        try:
            execution = self.client.execute_operation(
                operation.id,
                lease_token=keeper.token,
                # Read "now": a real agent would stamp each value as it reads it.
                field_values=field_values(issue, dt.datetime.now(dt.UTC)),
            )
        except GatewayRefused as refused:
            raise HandedToPerson(refused.reason, refused.escalation_id) from refused
        result = execution.operation
        say(f"{name}: gateway: {execution.outcome} (attempt {result.attempts})")
        if execution.outcome == "unknown":
            result = self._settle(result, keeper, name)
        if result.state == "verified" and result.provider_reference:
            say(f"{name}: ticket {result.provider_reference} verified")
            return result.provider_reference
        if result.state in ("conflict", "human_required"):
            raise HandedToPerson(
                result.reason_code or result.state, execution.escalation_id
            )
        raise AgentFailure(
            f"{name}: operation {result.state} ({result.reason_code or 'no reason'})"
        )

    def _settle(
        self, operation: Operation, keeper: LeaseKeeper, name: str
    ) -> Operation:
        """Wait for the portal's recovery to look the receipt up by key.

        The answer was lost or the call is still running: the portal, not this
        agent, finds out whether the ticket exists. Never call the desk again here.
        """
        say(f"{name}: result in doubt; the portal looks the receipt up")
        give_up_at = time.monotonic() + SETTLE_TIMEOUT_S
        while operation.state not in SETTLED:
            if time.monotonic() > give_up_at:
                raise AgentFailure(
                    f"{name}: still {operation.state} after {SETTLE_TIMEOUT_S:.0f} s; "
                    "the portal keeps looking, run again later"
                )
            keeper.check()
            time.sleep(1)
            operation = self.client.get_operation(operation.id)
        return operation


def print_events(client: PortalClient, task_id: str, name: str) -> None:
    """The task's audit trail, one line per event."""
    say(f"{name}: events")
    for event in client.list_events(task_id):
        detail = ""
        payload = event.payload if isinstance(event.payload, dict) else {}
        if "to" in payload:
            detail = f"{payload.get('from')} -> {payload['to']}"
        elif "checks" in payload:  # one check pass: every verdict in one event
            detail = ", ".join(
                f"{check.get('check')}: {check.get('verdict')}"
                for check in payload["checks"]
            )
        elif "check" in payload:
            detail = f"{payload['check']}: {payload.get('verdict')}"
        if event.reason_code:
            detail += f" [{event.reason_code}]"
        say(
            f"  {event.created_at:%H:%M:%S.%f} {event.code:<22} "
            f"{event.actor_type}:{event.actor_id} {detail}".rstrip()
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("PORTAL_API_KEY"),
        help="the agent's key (default: $PORTAL_API_KEY)",
    )
    add_issue_arguments(parser)
    parser.add_argument("--owner", default="customer-issue-agent")
    parser.add_argument(
        "--six-calls",
        action="store_true",
        help="the step-by-step lifecycle (register, lease, running, reserve, "
        "execute, succeeded) instead of one call per issue",
    )
    args = parser.parse_args(argv)
    if not args.api_key:
        parser.error("--api-key (or PORTAL_API_KEY) is required")
    check_issue_arguments(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    issues = demo_issues(args.issues, stale_issue=args.stale_issue)
    # One trace for the run, so its requests can be found together in the portal.
    trace_id = secrets.token_hex(16)
    say(f"customer-issue agent: {args.issues} issue(s), trace {trace_id}")
    tally = Tally()
    with PortalClient(
        args.base_url,
        args.api_key,
        traceparent=f"00-{trace_id}-{secrets.token_hex(8)}-01",
    ) as client:
        agent: _Agent = (
            CustomerIssueAgent(client, owner=args.owner, tally=tally)
            if args.six_calls
            else OneCallAgent(client, owner=args.owner, tally=tally)
        )
        for issue in issues:
            try:
                agent.handle(issue)
            except (Unauthenticated, PortalUnavailable) as exc:
                say(f"error: {exc}")  # every other issue would fail the same way
                return 1
            except (AgentFailure, LeaseLost, PortalError) as exc:
                tally.fail(issue.name, str(exc))
        for issue in issues:
            task_id = agent.task_ids.get(issue.name)
            if task_id is None:
                continue  # never registered; its failure is reported above
            try:
                agent.print_events(task_id, issue.name)
            except PortalError as exc:
                tally.fail(issue.name, f"cannot read events: {exc}")
    say(tally.summary())
    return tally.exit_status(issues)


if __name__ == "__main__":
    sys.exit(main())
