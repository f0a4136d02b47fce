"""Example agent: each confirmed customer issue becomes one support ticket.

The seed's worked example ("客户问题转工单"), run against a live portal::

    python3 manage.py up          # prints the demo agent's key (Agent key: ...)
    .venv/bin/python examples/customer_issue_agent.py \\
        --base-url http://127.0.0.1:8000 --api-key agp_... --issues 3

For each issue ``n`` the agent records the issue's version, registers the task
``issue-<n>``, claims it, reserves the side effect ``create_ticket`` on
``ticket-desk`` under the business key ``ticket-for-issue-<n>``, marks it started,
calls the ticket desk, reports the receipt (the ticket id) as verified, moves the
task to ``succeeded`` and prints the task's audit trail.

Safe to run again, and to re-run after a crash: every step is keyed, so a second
run finds the same tasks and operations (answers 200, nothing duplicated), and a run
cut short resumes where the portal says the work stands.

There is no ticket desk server yet, so ``TicketDesk`` stands in for it: it answers a
ticket id derived from the issue (``TCK-<n>``), as a real desk would answer the same
ticket for a repeated idempotency key.

Exit status: 0 when every issue has its verified ticket, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from portal_client import (
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
OBJECT_TYPE: Final = "customer_issue"
ACTION: Final = "create_ticket"
TARGET: Final = "ticket-desk"
QUEUE: Final = "support_queue_a"
LEASE_TTL_S: Final = 30

SUMMARIES: Final = (
    "Login fails after a password reset",
    "Invoice shows the wrong VAT rate",
    "CSV export times out for large reports",
    "Mobile app crashes when opening settings",
    "Order confirmation e-mail never arrives",
)


class AgentFailure(Exception):
    """The issue cannot be finished automatically; a person has to look."""


@dataclass(frozen=True, kw_only=True)
class CustomerIssue:
    """A confirmed customer issue (invented, deterministic demo data)."""

    number: int
    customer: str
    summary: str
    version: str = "1"

    @property
    def client_task_id(self) -> str:
        return f"issue-{self.number}"

    @property
    def ticket_key(self) -> str:
        return f"ticket-for-issue-{self.number}"

    @property
    def ticket_input(self) -> dict[str, Any]:
        # Exactly the same every run: the portal hashes it to recognise a repeat.
        return {"queue": QUEUE, "summary": self.summary, "customer": self.customer}


def demo_issues(count: int) -> list[CustomerIssue]:
    return [
        CustomerIssue(
            number=n,
            customer=f"CUST-{n:04d}",
            summary=SUMMARIES[(n - 1) % len(SUMMARIES)],
        )
        for n in range(1, count + 1)
    ]


class TicketDesk:
    """Stand-in for the ticket desk (a later issue adds a real server).

    Deterministic per idempotency key, like a desk that deduplicates by key: creating
    twice answers the same ticket, and a lookup finds it.
    """

    def create(self, *, idempotency_key: str, ticket: dict[str, Any]) -> str:
        return self._ticket_id(idempotency_key)

    def find(self, *, idempotency_key: str) -> str | None:
        return self._ticket_id(idempotency_key)

    @staticmethod
    def _ticket_id(idempotency_key: str) -> str:
        return "TCK-" + idempotency_key.rsplit("-", 1)[-1]


def say(line: str) -> None:
    print(line, flush=True)


class CustomerIssueAgent:
    def __init__(self, client: PortalClient, *, owner: str, desk: TicketDesk) -> None:
        self.client = client
        self.owner = owner
        self.desk = desk
        self.task_ids: dict[str, str] = {}  # client task id -> task id, for reports

    def handle(self, issue: CustomerIssue) -> str:
        """Bring one issue to a verified ticket; returns the ticket id.

        Raises:
            AgentFailure: the task or operation needs a person.
            LeaseLost: the lease went away mid-work; a later run resumes.
            PortalError: the portal refused a step.
        """
        name = issue.client_task_id
        self.client.record_object_version(
            OBJECT_TYPE, str(issue.number), version=issue.version
        )
        task, created = self.client.register_task(
            client_task_id=name,
            workflow_key=WORKFLOW_KEY,
            workflow_version=WORKFLOW_VERSION,
            object_type=OBJECT_TYPE,
            object_id=str(issue.number),
            object_version=issue.version,
        )
        self.task_ids[name] = task.id
        say(
            f"{name}: task {task.id} "
            f"{'registered' if created else 'already registered'} ({task.state})"
        )
        if task.state == "succeeded":
            # Finished by an earlier run: the same reservation answers the stored
            # operation (no lease needed to read back an existing reservation).
            operation = self._reserve(task, issue, lease_token=task.lease.token)
            say(
                f"{name}: already done; ticket {operation.provider_reference} "
                f"(operation {operation.id} {operation.state})"
            )
            if operation.state != "verified" or not operation.provider_reference:
                raise AgentFailure(f"{name}: succeeded without a verified ticket")
            return operation.provider_reference
        if task.state not in ("pending", "running"):
            raise AgentFailure(f"{name}: task is {task.state}; left for a person")

        task = self._claim(task)
        say(f"{name}: claimed by {self.owner} (lease token {task.lease.token})")
        try:
            with LeaseKeeper(
                self.client, task.id, task.lease.token, LEASE_TTL_S
            ) as keeper:
                operation = self._reserve(task, issue, lease_token=keeper.token)
                keeper.check()
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
        except (AgentFailure, LeaseLost, PortalError):
            self._hand_back(task)
            raise
        say(f"{name}: task {task.state} (state version {task.state_version})")
        return ticket

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
            f"{issue.client_task_id}: operation {operation.id} "
            f"{'reserved' if created else 'found'} "
            f"(key {operation.idempotency_key}, {operation.state})"
        )
        return operation

    def _execute(
        self, operation: Operation, issue: CustomerIssue, keeper: LeaseKeeper
    ) -> str:
        name = issue.client_task_id
        if operation.state == "verified" and operation.provider_reference:
            return operation.provider_reference
        if operation.state in ("executing", "unknown"):
            # An earlier attempt may have reached the desk: look before calling again.
            found = self.desk.find(idempotency_key=operation.idempotency_key)
            if found is not None:
                return self._verified(operation, found, keeper, name)
        if operation.state not in ("reserved", "executing", "unknown"):
            raise AgentFailure(f"{name}: operation is {operation.state}")
        if operation.state != "executing":
            operation = self.client.start_operation(
                operation.id, lease_token=keeper.token
            )
            say(f"{name}: operation started (attempt {operation.attempts})")
        keeper.check()  # the last moment to stop before the side effect
        ticket = self.desk.create(
            idempotency_key=operation.idempotency_key, ticket=issue.ticket_input
        )
        return self._verified(operation, ticket, keeper, name)

    def _verified(
        self, operation: Operation, ticket: str, keeper: LeaseKeeper, name: str
    ) -> str:
        operation = self.client.report_outcome(
            operation.id,
            lease_token=keeper.token,
            outcome="verified",
            provider_reference=ticket,
            result={"ticket_id": ticket, "queue": QUEUE},
        )
        say(f"{name}: ticket {ticket} verified (operation {operation.state})")
        return ticket

    def print_events(self, task_id: str, name: str) -> None:
        say(f"{name}: events")
        for event in self.client.list_events(task_id):
            detail = ""
            if isinstance(event.payload, dict) and "to" in event.payload:
                detail = f"{event.payload.get('from')} -> {event.payload['to']}"
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
    parser.add_argument("--issues", type=int, default=3, metavar="N")
    parser.add_argument("--owner", default="customer-issue-agent")
    args = parser.parse_args(argv)
    if not args.api_key:
        parser.error("--api-key (or PORTAL_API_KEY) is required")
    if args.issues < 1:
        parser.error("--issues must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # One trace for the run, so its requests can be found together in the portal.
    trace_id = secrets.token_hex(16)
    say(f"customer-issue agent: {args.issues} issue(s), trace {trace_id}")
    failed: set[str] = set()
    with PortalClient(
        args.base_url,
        args.api_key,
        traceparent=f"00-{trace_id}-{secrets.token_hex(8)}-01",
    ) as client:
        agent = CustomerIssueAgent(client, owner=args.owner, desk=TicketDesk())
        for issue in demo_issues(args.issues):
            try:
                agent.handle(issue)
            except (Unauthenticated, PortalUnavailable) as exc:
                say(f"error: {exc}")  # every other issue would fail the same way
                return 1
            except (AgentFailure, LeaseLost, PortalError) as exc:
                failed.add(issue.client_task_id)
                say(f"{issue.client_task_id}: FAILED: {exc}")
        for issue in demo_issues(args.issues):
            task_id = agent.task_ids.get(issue.client_task_id)
            if task_id is None:
                continue  # never registered; its failure is reported above
            try:
                agent.print_events(task_id, issue.client_task_id)
            except PortalError as exc:
                failed.add(issue.client_task_id)
                say(f"{issue.client_task_id}: cannot read events: {exc}")
    say(f"done: {args.issues - len(failed)} ok, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
