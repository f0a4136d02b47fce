"""The desk's resolve and edit forms, and the sentences that report them.

Which resolutions a task offers (approve only where ``takeover.APPROVABLE_REASONS``
allows it), their labels and help; the rows of the edit form (the pinned
contract's required fields, kept when the value sealed at the refused execute
still passes, else asked with why); the sentence an edit's outcome becomes.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidTag

from audit.redaction import redact
from portal.codes import ReasonCode
from portal.db import db_now
from portal.exceptions import PortalError
from tasks import takeover
from tasks.contracts import contract_sensitive_fields
from tasks.gateway import FieldValue
from tasks.gateway.checks import field_problems
from tasks.models import Contract, Escalation, Operation, OperationState, Task
from tasks.sealed import operation_given_fields

from .names import human_age


@dataclass(frozen=True, kw_only=True)
class ResolutionChoice:
    value: str
    label: str
    help: str


# The desk's order: the likely answers first. ``retry`` is the API's older name for
# approve and is not offered twice; ``edit`` is its own form (desk_edit).
RESOLUTION_CHOICES: Final[tuple[ResolutionChoice, ...]] = (
    ResolutionChoice(
        value="hand_back",
        label="Hand back for a fresh read",
        help="The agent reads the fields again and executes under the same key.",
    ),
    ResolutionChoice(
        value="verify",
        label="Verify: I found the receipt",
        help="Give the receipt id you found at the provider; nothing is called.",
    ),
    ResolutionChoice(
        value="approve",
        label="Approve as is",
        help="Run the same input once more, under the same key.",
    ),
    ResolutionChoice(
        value="cancel",
        label="Cancel",
        help="Nobody should do this any more; open operations fail.",
    ),
    ResolutionChoice(
        value="fail",
        label="Fail",
        help="It cannot be done; open operations fail and the task fails.",
    ),
    ResolutionChoice(
        value="complete",
        label="Complete",
        help="It is done (outside the portal); the task succeeds.",
    ),
)
EDIT_HELP: Final = (
    "You give a fresh value for each asked field, with its source and when you "
    "read it; a field whose value still passes is kept unless you give another. "
    "The gateway checks everything again and calls once, under the operation's "
    "own key. If it is verified, the task goes back to the agent; if not, it "
    "stays with you."
)
HAND_BACK_NOTE: Final = "what should the agent read again?"


def resolution_choices(*, task: Task) -> list[ResolutionChoice]:
    """The resolutions the desk offers for this task.

    ``approve`` only where the task's reason is in ``takeover.APPROVABLE_REASONS``:
    elsewhere the same input would be refused again (the service refuses it too).
    """
    return [
        choice
        for choice in RESOLUTION_CHOICES
        if choice.value != "approve" or task.reason_code in takeover.APPROVABLE_REASONS
    ]


def resolution_label(resolution: str) -> str:
    if resolution == takeover.EDITED_AND_EXECUTED:
        return "Edited the fields and executed"
    for choice in RESOLUTION_CHOICES:
        if choice.value == resolution:
            return choice.label
    return resolution.replace("_", " ")


# --- the edit form -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GivenField:
    """A value given at the operation's last refused execute, as the desk shows it:
    the value redacted (the contract's sensitive fields too), its source and read
    time. The real value stays sealed; an edit takes it from there, never the form."""

    shown: str
    source: str
    observed_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class EditRow:
    """One required field of the task's pinned contract, kept or asked.

    ``kept``: the value given last passes the field check now (right source, fresh
    enough), so the edit keeps it unless the person gives another. Otherwise the
    row is asked, and ``why`` says which check failed and what was read.
    """

    name: str
    source: str
    max_age_s: int
    given: GivenField | None = None
    kept: bool = False
    why: str = ""

    @property
    def max_age(self) -> str:
        return human_age(dt.timedelta(seconds=self.max_age_s))

    @property
    def kept_text(self) -> str:
        """A kept row's line: what is kept and until when it passes."""
        if not self.kept or self.given is None:
            return ""
        until = self.given.observed_at + dt.timedelta(seconds=self.max_age_s)
        return (
            f"{self.given.shown} from {self.given.source}, read at "
            f"{_when(self.given.observed_at)}; passes the fields check until "
            f"{_when(until)}. Leave it empty to keep it."
        )


def _when(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _asked_why(
    *,
    required: dict[str, Any],
    given: GivenField | None,
    refused: dict[str, Any] | None,
    now_problem: dict[str, Any] | None,
) -> str:
    """Why a row is asked: the check that refused it (the escalation's evidence),
    else what fails now (the value aged since), with the value read as redacted."""
    if given is None:
        return (
            "no value was given for it at the refused execute"
            if refused is None or refused.get("problem") == ReasonCode.FIELD_MISSING
            else "the value given is not kept; give it again"
        )
    read = f"read {given.shown} from {given.source} at {_when(given.observed_at)}"
    problem = refused or now_problem
    words = _problem_words(problem) if problem else None
    if refused is not None:
        return (
            f"the fields check refused it ({refused.get('problem')}): {words}; {read}"
        )
    if now_problem is not None and now_problem.get("problem") == ReasonCode.FIELD_STALE:
        return (
            f"it passed at the check but is now older than the contract allows "
            f"({human_age(dt.timedelta(seconds=int(required['max_age_s'])))}); {read}"
        )
    return f"{words or 'it does not pass the fields check now'}; {read}"


def desk_edit_rows(
    *, task: Task, operation: Operation | None = None
) -> list[EditRow] | None:
    """The edit form's rows: the pinned contract's ``required_fields``, in order.

    With ``operation``, each row knows the value given at its last refused execute
    (sealed with it) and whether that value passes the field check on the
    database's clock now: passing rows are kept, the others asked with the reason,
    taken from the open escalation's ``conflicting_fields`` where it names the field.

    None when the task pins no contract (there is nothing to check values against,
    and the gateway would refuse to execute).
    """
    if task.contract_key is None or task.contract_version is None:
        return None
    spec = (
        Contract.objects.filter(
            tenant_id=task.tenant_id,
            key=task.contract_key,
            version=task.contract_version,
        )
        .values_list("spec", flat=True)
        .first()
    )
    if not isinstance(spec, dict):
        return None
    required_fields = list(spec.get("required_fields") or [])
    given = _given_fields(operation=operation) if operation is not None else {}
    if not given:
        return [
            EditRow(
                name=str(required["name"]),
                source=str(required["source"]),
                max_age_s=int(required["max_age_s"]),
            )
            for required in required_fields
        ]
    _, problems = field_problems(
        spec={"required_fields": required_fields},
        fields=list(given.values()),
        now=db_now(),
    )
    failing = {str(problem["field"]): problem for problem in problems}
    refused = (
        _refused_fields(task=task, operation=operation) if operation is not None else {}
    )
    shown = redact(
        {name: field.value for name, field in given.items()},
        tenant_id=task.tenant_id,
        sensitive=contract_sensitive_fields(spec),
    )
    rows = []
    for required in required_fields:
        name = str(required["name"])
        value = given.get(name)
        seen = (
            GivenField(
                shown=_shown(shown.get(name)),
                source=value.source,
                observed_at=value.observed_at,
            )
            if value is not None
            else None
        )
        kept = name not in failing
        rows.append(
            EditRow(
                name=name,
                source=str(required["source"]),
                max_age_s=int(required["max_age_s"]),
                given=seen,
                kept=kept,
                why=""
                if kept
                else _asked_why(
                    required=required,
                    given=seen,
                    refused=refused.get(name),
                    now_problem=failing.get(name),
                ),
            )
        )
    return rows


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _given_fields(*, operation: Operation) -> dict[str, FieldValue]:
    """The fields sealed with the operation at its last refused execute, by name."""
    given: dict[str, FieldValue] = {}
    try:
        sealed_fields = operation_given_fields(operation)
    except (PortalError, InvalidTag, ValueError):
        # Not openable with this server secret: nothing is kept, every row asked.
        return given
    for item in sealed_fields:
        try:
            given[str(item["name"])] = FieldValue(
                name=str(item["name"]),
                value=item["value"],
                source=str(item["source"]),
                observed_at=dt.datetime.fromisoformat(str(item["observed_at"])),
            )
        except (KeyError, TypeError, ValueError):
            continue
    return given


def _refused_fields(*, task: Task, operation: Operation) -> dict[str, dict[str, Any]]:
    """The open escalation's ``conflicting_fields`` for this operation, by field."""
    evidence = (
        Escalation.objects.filter(
            tenant_id=task.tenant_id,
            task_id=task.pk,
            operation_id=operation.pk,
            resolved_at__isnull=True,
        )
        .order_by("-created_at", "-id")
        .values_list("evidence", flat=True)
        .first()
    )
    problems = (
        evidence.get("conflicting_fields") if isinstance(evidence, dict) else None
    )
    return {
        str(problem["field"]): problem
        for problem in problems or []
        if isinstance(problem, dict) and "field" in problem
    }


def edit_fields(
    *, rows: Sequence[EditRow], operation: Operation, given: Sequence[FieldValue]
) -> list[FieldValue]:
    """The fields an edit executes with: what the person gave, and for each kept row
    the person left empty, the value sealed with the operation (never one posted)."""
    by_name = {field.name: field for field in given}
    sealed = _given_fields(operation=operation)
    fields = []
    for row in rows:
        if row.name in by_name:
            fields.append(by_name[row.name])
        elif row.kept and row.name in sealed:
            fields.append(sealed[row.name])
    return fields


def edit_operations(*, operations: Iterable[Operation]) -> list[Operation]:
    """The operations an edit can execute: those waiting for a person."""
    return [o for o in operations if o.state == OperationState.HUMAN_REQUIRED]


def desk_now() -> dt.datetime:
    """The clock the gateway measures field ages on (the database's)."""
    return db_now()


def _problem_words(problem: Any) -> str | None:
    if not isinstance(problem, dict):
        return None
    name = problem.get("field", "a field")
    kind = problem.get("problem")
    if kind == ReasonCode.FIELD_MISSING:
        return f"{name} is missing"
    if kind == ReasonCode.FIELD_SOURCE_MISMATCH:
        return (
            f"{name} came from {problem.get('source')}; the contract wants "
            f"{problem.get('expected_source')}"
        )
    if kind == ReasonCode.FIELD_STALE:
        try:
            age = float(problem["age_s"])
            allowed = float(problem["max_age_s"])
        except (KeyError, TypeError, ValueError):
            return f"{name} is stale"
        if age < 0:
            return f"{name} was read in the future (check the read time)"
        return (
            f"{name} was read {human_age(dt.timedelta(seconds=age))} before the "
            f"check; the contract allows {human_age(dt.timedelta(seconds=allowed))}"
        )
    return None


def refusal_detail(*, evidence: Any) -> str:
    """A refusal's evidence in one sentence a person can act on."""
    if not isinstance(evidence, dict):
        return "see the new escalation's evidence below"
    words = [
        sentence
        for problem in evidence.get("conflicting_fields") or []
        if (sentence := _problem_words(problem))
    ]
    if words:
        return "; ".join(words)
    if evidence.get("current_version") is not None:
        return (
            f"the object is at version {evidence['current_version']}, "
            f"read at {evidence.get('version_read')}"
        )
    return "see the new escalation's evidence below"


@dataclass(frozen=True, kw_only=True)
class EditReport:
    ok: bool
    text: str


def edit_report(*, task: Task, outcome: takeover.EditOutcome) -> EditReport:
    """What an edit came to, in the sentence the desk shows."""
    result = outcome.result
    operation = result.operation
    if result.outcome == "verified":
        return EditReport(
            ok=True,
            text=(
                f"Executed: ticket {operation.provider_reference} verified; "
                "the task went back to the agent."
            ),
        )
    if result.outcome == "refused":
        evidence = (
            Escalation.objects.filter(tenant_id=task.tenant_id, pk=result.escalation_id)
            .values_list("evidence", flat=True)
            .first()
            if result.escalation_id
            else None
        )
        return EditReport(
            ok=False,
            text=(
                f"The gateway refused it again: {result.reason} — "
                f"{refusal_detail(evidence=evidence)}; the task stays with you."
            ),
        )
    if result.outcome == "failed":
        why = f" ({result.reason})" if result.reason else ""
        text = (
            f"The remote system {operation.target} rejected the call{why}: the "
            "operation failed (fail, cancel or hand back); the task stays with you."
        )
    elif result.outcome == "conflict":
        text = (
            f"The remote system {operation.target} answered with more than one "
            "receipt: verify the right one; the task stays with you."
        )
    else:
        text = (
            f"The call's outcome is in doubt ({result.reason or result.outcome}): "
            "the gateway looks the receipt up under the same key; the task stays "
            "with you."
        )
    return EditReport(ok=False, text=text)
