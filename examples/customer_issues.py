"""The demo's customer issues and the tally both example agents keep of them.

``customer_issue_agent.py`` (REST) and ``mcp_agent.py`` (MCP) work the same issues:
issue ``n`` becomes the ticket keyed ``ticket-for-issue-<n>``, and one of them
(``--stale-issue``) was read ten minutes ago so that the portal hands it to a
person. Each run ends with one line per run, ``done: ...``, and its exit status,
read from :class:`Tally`: every issue counts once, as what happened to it on this
run, whatever happened on the runs before.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

OBJECT_TYPE: Final = "customer_issue"
OBJECT_VERSION: Final = "7"
QUEUE: Final = "support_queue_a"
# Longer ago than the contract's max_age_s for the e-mail (300 s): the stale case.
STALE_AGE: Final = dt.timedelta(minutes=10)

SUMMARIES: Final = (
    "Login fails after a password reset",
    "Invoice shows the wrong VAT rate",
    "CSV export times out for large reports",
    "Mobile app crashes when opening settings",
    "Order confirmation e-mail never arrives",
)
PLANS: Final = ("pro", "basic", "enterprise")


def say(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True, kw_only=True)
class CustomerIssue:
    """A confirmed customer issue (invented, deterministic demo data)."""

    number: int
    customer: str
    email: str
    plan: str
    summary: str
    # How long ago the agent read the e-mail address from the CRM.
    email_age: dt.timedelta = dt.timedelta(0)

    @property
    def name(self) -> str:
        """The issue's task, as the agent names it (``client_task_id``)."""
        return f"issue-{self.number}"

    @property
    def ticket_key(self) -> str:
        return f"ticket-for-issue-{self.number}"

    @property
    def stale(self) -> bool:
        return self.email_age > dt.timedelta(0)

    @property
    def ticket_input(self) -> dict[str, Any]:
        # Exactly the same every run: the portal hashes it to recognise a repeat.
        # Only queue, summary and customer: the desk refuses members it does not know
        # (the gateway adds the object and the contract's read fields itself).
        return {"queue": QUEUE, "summary": self.summary, "customer": self.customer}

    def reads(self, now: dt.datetime) -> dict[str, tuple[str, str, dt.datetime]]:
        """What the agent read: by field name, the value, its source and when."""
        return {
            "email": (self.email, "crm", now - self.email_age),
            "plan": (self.plan, "billing", now),
        }


def demo_issues(count: int, *, stale_issue: int) -> list[CustomerIssue]:
    return [
        CustomerIssue(
            number=n,
            customer=f"CUST-{n:04d}",
            email=f"customer{n}@example.com",
            plan=PLANS[(n - 1) % len(PLANS)],
            summary=SUMMARIES[(n - 1) % len(SUMMARIES)],
            email_age=STALE_AGE if n == stale_issue else dt.timedelta(0),
        )
        for n in range(1, count + 1)
    ]


def add_issue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--issues", type=int, default=3, metavar="N")
    parser.add_argument(
        "--stale-issue",
        type=int,
        default=None,
        metavar="K",
        help="the issue whose e-mail was read 10 minutes ago, so a person gets it "
        "(default: the last one; 0: none)",
    )


def check_issue_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> None:
    if args.issues < 1:
        parser.error("--issues must be at least 1")
    if args.stale_issue is None:
        args.stale_issue = args.issues


# What became of an issue on this run:
# "ticket": its ticket is verified (made now or before; by the agent, or after a
#   person handed it back or gave fresh values).
# "person": a person has it (it waits on the desk), or a person ended it without
#   a ticket (cancelled, failed).
# "failed": the agent could not finish it and no person has it.
Outcome = Literal["ticket", "person", "failed"]


@dataclass
class Tally:
    """Each issue once, as what happened to it; the run's summary and exit status."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def ticket(self, name: str, *, after_person: bool = False) -> None:
        self.outcomes[name] = "ticket"
        if after_person:
            self.notes[name] = "after a person"

    def person(self, name: str, *, settled: str | None = None) -> None:
        """A person has the issue; ``settled``: the task's end state they chose."""
        self.outcomes[name] = "person"
        if settled:
            self.notes[name] = f"{settled} by a person"

    def fail(self, name: str, why: str) -> None:
        """The issue failed (whatever was counted for it before on this run)."""
        self.outcomes[name] = "failed"
        self.notes.pop(name, None)
        say(f"{name}: FAILED: {why}")

    def _names(self, outcome: Outcome) -> list[str]:
        return [
            f"{name} {self.notes[name]}" if name in self.notes else name
            for name, this in self.outcomes.items()
            if this == outcome
        ]

    def summary(self) -> str:
        tickets, people, failed = (
            self._names(o) for o in ("ticket", "person", "failed")
        )
        after = [name for name in tickets if " " in name]
        return (
            f"done: {len(tickets)} ticket(s)"
            + (f" ({', '.join(after)})" if after else "")
            + f", {len(people)} with a person ({', '.join(people) or 'none'}), "
            f"{len(failed)} failed" + (f" ({', '.join(failed)})" if failed else "")
        )

    def exit_status(self, issues: Sequence[CustomerIssue]) -> int:
        """0 when every issue has its ticket or is with a person; 1 otherwise."""
        counted = all(issue.name in self.outcomes for issue in issues)
        return 0 if counted and "failed" not in self.outcomes.values() else 1
