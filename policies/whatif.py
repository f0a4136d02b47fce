"""What a draft would have changed: its verdicts against the set in force, over
recorded requests (docs/policies.md, "What-if").

Pure: the caller reads the stored operations (the console, over the tenant's last N
days) and turns each into a ``PolicyRequest``; nothing here calls a remote.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .engine import Decision, PolicyRequest, Verdict, evaluate_text, request_amounts


@dataclass(frozen=True, kw_only=True)
class Change:
    """One recorded request whose verdict the draft would change."""

    ref: str  # the operation's id
    at: dt.datetime
    agent_name: str
    action: str
    target: str
    amounts: Mapping[str, int]  # what the policies compared (request_amounts)
    before: Decision
    after: Decision


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    evaluated: int
    changes: list[Change]

    @property
    def newly_refused(self) -> list[Change]:
        return [c for c in self.changes if c.after.verdict != Verdict.ALLOW]

    @property
    def newly_allowed(self) -> list[Change]:
        return [c for c in self.changes if c.after.verdict == Verdict.ALLOW]


_GRANTS_ONLY = Decision(verdict=Verdict.ALLOW)


def what_if(
    *,
    draft_text: str,
    in_force_text: str | None,
    requests: Iterable[tuple[str, PolicyRequest]],
) -> WhatIf:
    """Evaluate ``draft_text`` and the set in force (None: grants alone, which
    allowed) on each ``(ref, request)``; keep those whose verdict differs."""
    evaluated = 0
    changes = []
    for ref, request in requests:
        evaluated += 1
        before = (
            evaluate_text(text=in_force_text, request=request)
            if in_force_text is not None
            else _GRANTS_ONLY
        )
        after = evaluate_text(text=draft_text, request=request)
        if before.verdict != after.verdict:
            changes.append(
                Change(
                    ref=ref,
                    at=request.at,
                    agent_name=request.agent_name,
                    action=request.action,
                    target=request.target,
                    amounts=request_amounts(request),
                    before=before,
                    after=after,
                )
            )
    return WhatIf(evaluated=evaluated, changes=changes)
