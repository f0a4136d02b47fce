"""Execute: the entry points, the checks run as a loop, then the call.

``operation_execute`` (an agent, under its lease) and ``operation_run_queued`` (a
worker, for an execution queued earlier) both run ``authorize``: it locks the task
and the operation, settles repeats, and runs ``checks.CHECKS`` in order; the pass
writes one ``gateway.checked`` event with every verdict. The first refusal ends the
pass and hands the task to a person. When all pass, the credentials are issued (or,
queued, the authorisation recorded) and the transaction commits; ``run`` then makes
the call with no transaction open, and its ``operation.executing`` event records
the credentials.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

from django.db import transaction
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import Span

from audit.redaction import redact
from portal import db as portal_db
from portal import logs, tracing
from portal.actors import Actor, ActorType
from portal.codes import ReasonCode
from portal.db import db_now
from portal.exceptions import LeaseExpired
from portal.models import Tenant
from portal.tracing import NO_TRACE, Trace

from ..contracts import contract_receipt_required, contract_sensitive_fields
from ..exceptions import ActionNotGranted, ContractRequired, OperationNotFound
from ..models import Contract, Escalation, Operation, OperationState, TaskState
from ..sealed import keep_given_fields, operation_values, seal
from .call import authorize_call, begin_call, call
from .checks import (
    CHECKS,
    CheckContext,
    FieldValue,
    Refusal,
    caller_may_execute,
    check_entry,
    check_reads,
    checks_recorded,
    refuse,
)
from .common import SYSTEM, TestHook, lock, no_hook
from .recovery import operation_recover
from .results import Authorized, GatewayResult, Refused, outcome_of, standing

# How long a queued execution may wait for its worker before the settle job runs it.
QUEUED_GRACE_S: Final = 30

# Operation states in which a repeated execute only reports where things stand.
_SETTLED_OR_UNDER_WAY: Final = (
    OperationState.VERIFIED,
    OperationState.FAILED,
    OperationState.EXECUTING,
    OperationState.UNKNOWN,
    OperationState.CONFLICT,
)


@transaction.atomic(durable=True)
def authorize(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    lease_token: int | None,
    fields: Sequence[FieldValue],
    actor: Actor,
    trace: Trace,
    queue: bool = False,
) -> Authorized | Refused | GatewayResult:
    """Run the checks. ``lease_token``: an agent, now. None: a queued run, fenced by
    the token recorded when it was queued. ``queue``: record the authorisation for a
    worker instead of issuing a credential for an immediate call."""
    locked = lock(tenant=tenant, operation_id=operation_id)
    if locked is None:
        raise OperationNotFound(operation_id=str(operation_id))
    task, operation = locked
    now = db_now()
    if lease_token is not None and (
        task.lease_token != lease_token
        or task.lease_owner is None
        or task.lease_expires_at is None
        or task.lease_expires_at <= now
    ):
        raise LeaseExpired(operation_id=str(operation_id), lease_token=lease_token)
    if lease_token is None and (
        operation.authorized_token is None
        or task.lease_token != operation.authorized_token
        or task.state not in (TaskState.PENDING, TaskState.RUNNING, TaskState.WAITING)
    ):
        # Taken over (a person, or another worker) since it was queued: whoever
        # holds the task now decides; this run does nothing.
        return GatewayResult(
            outcome=outcome_of(operation),
            operation=operation,
            reason=ReasonCode.LEASE_EXPIRED,
        )
    if (
        lease_token is not None
        and actor.type == ActorType.AGENT
        and actor.id not in _agents_of(operation)
        and not caller_may_execute(tenant=tenant, operation=operation, actor=actor)
    ):
        # Holding the task's lease is no authority: an agent with no grant of its own
        # is refused as at reserve, before anything is written (no confused deputy).
        # An agent that reserved or executed it and lost its grant since is refused
        # by the permission check below, and the task goes to a person.
        raise ActionNotGranted(action=operation.action, target=operation.target)
    if operation.state in _SETTLED_OR_UNDER_WAY:
        # Executing the same operation again is idempotent: report where it stands.
        return standing(operation)
    if task.contract_key is None or task.contract_version is None:
        raise ContractRequired(task_id=str(task.pk))
    reads = check_reads(tenant=tenant, task=task, operation=operation)
    contract = reads.contract
    if contract is None:  # the pin's foreign key keeps it: never seen
        raise Contract.DoesNotExist("Contract matching query does not exist.")
    context = CheckContext(
        tenant=tenant,
        task=task,
        operation=operation,
        contract=contract,
        reads=reads,
        fields=fields,
        now=now,
        actor=actor,
        trace=trace,
    )
    passed: list[dict[str, Any]] = []
    for name, check in CHECKS:
        verdict = check(context)
        if isinstance(verdict, Refusal):
            # A person settles it: the values given stay sealed with the operation
            # so the desk asks only for those that fail
            # (console/takeover_desk/forms.py).
            keep_given_fields(operation, fields)
            return refuse(
                tenant=tenant,
                task=task,
                operation=operation,
                reason=verdict.reason,
                check=name,
                actor=actor,
                trace=trace,
                contract=contract,
                passed=passed,
                **verdict.evidence,
            )
        if verdict is not None:
            passed.append(check_entry(name, verdict))
    # One event for the whole pass, every verdict in it (docs/gateway.md).
    checks_recorded(
        tenant=tenant,
        operation=operation,
        checks=passed,
        reason=None,
        actor=actor,
        trace=trace,
        contract=contract,
    )
    connector = context.connector
    assert connector is not None  # the target check refuses without one
    spec = contract.spec
    # 7. Credential: scoped to this tenant, object, fields, action and target.
    given = {field.name: field.value for field in fields}
    real_input, call_fields = operation_values(operation)
    if call_fields is None:
        read_fields = spec["policy"]["read_fields"]
        call_fields = {name: given[name] for name in read_fields if name in given}
        # Stored redacted; the real values are sealed with the input for the call.
        operation.call_fields = redact(
            call_fields,
            tenant_id=tenant.pk,
            sensitive=contract_sensitive_fields(spec),
        )
        operation.sealed = seal(
            tenant_id=tenant.pk,
            operation_id=operation.pk,
            values={"input": real_input, "call_fields": call_fields},
        )
    # Whose authority this execution runs under: the calling agent (a queued run
    # executes for it), or None for a person (the events name the person).
    operation.executed_by_agent_id = (
        uuid.UUID(actor.id) if actor.type == ActorType.AGENT else None
    )
    Operation.objects.filter(tenant=tenant, pk=operation.pk).update(
        call_fields=operation.call_fields,
        sealed=operation.sealed,
        executed_by_agent_id=operation.executed_by_agent_id,
    )
    if queue:
        Operation.objects.filter(tenant=tenant, pk=operation.pk).update(
            authorized_at=now,
            authorized_token=task.lease_token,
            field_provenance=[
                {
                    "name": f.name,
                    "source": f.source,
                    "observed_at": f.observed_at.isoformat(),
                }
                for f in fields
            ],
            # If the worker's message is lost, the settle job starts it after this.
            next_check_at=now + dt.timedelta(seconds=QUEUED_GRACE_S),
        )
        operation.refresh_from_db()
        return GatewayResult(outcome="queued", operation=operation)
    return authorize_call(
        tenant=tenant,
        task=task,
        operation=operation,
        connector=connector,
        ttl_s=context.ttl_s(),  # the contract's, or a policy's shorter one
        now=now,
        actor=actor,
        trace=trace,
        receipt_required=contract_receipt_required(spec),
    )


def _agents_of(operation: Operation) -> set[str]:
    """The agents that already acted on the operation: who reserved, who executed."""
    return {
        str(agent_id)
        for agent_id in (operation.agent_id, operation.executed_by_agent_id)
        if agent_id is not None
    }


def operation_execute(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    lease_token: int,
    fields: Sequence[FieldValue],
    actor: Actor,
    trace: Trace = NO_TRACE,
    queue: bool = False,
    _test_hook: TestHook = no_hook,
) -> GatewayResult:
    """Check, call at most once per key, and record; or hand the task to a person.

    Guarantee: the remote system is called only after every check passed and their
    verdicts committed; no transaction is open during the call; the call carries the
    operation's own idempotency key, on retries too. Calling this again for the same
    operation reports where it stands instead of calling again.

    With ``queue``, the checks run now and their verdict commits (outcome
    ``queued``); ``operation_run_queued`` on a worker makes the call later.

    The caller executes under its own authority: an agent's own grant, a person's
    ``work_takeover`` role. Holding the task's lease is not enough.

    Raises:
        OperationNotFound: no such operation in the tenant.
        LeaseExpired: the caller's lease token is not current.
        ActionNotGranted: the calling agent holds no grant for the action and target
            (and did not reserve or execute the operation); nothing was written.
        ContractRequired: the task pins no contract.
    """
    portal_db.forbid_transaction("the gateway calls the remote system")
    with tool_span(operation_id=operation_id, trace=trace) as (span, trace):
        plan = authorize(
            tenant=tenant,
            operation_id=operation_id,
            lease_token=lease_token,
            fields=fields,
            actor=actor,
            trace=trace,
            queue=queue,
        )
        return verdict_recorded(
            span,
            run(
                tenant=tenant,
                plan=plan,
                lease_token=lease_token,
                actor=actor,
                trace=trace,
                hook=_test_hook,
            ),
        )


def operation_run_queued(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    trace: Trace = NO_TRACE,
    _test_hook: TestHook = no_hook,
) -> GatewayResult:
    """Make the call of an execution that was queued, on a worker; safe to repeat.

    Everything time can change is checked again first: the contract, the fields'
    age (from the recorded provenance), the target, the grant of the agent that
    queued it (``executed_by_agent``, not the one that reserved), the object
    version, and that nobody took the task over since it was queued. A second run of
    the same message finds the operation no longer ``reserved`` and does nothing;
    a run killed after the call is settled by the receipt lookup, never by a call.
    """
    portal_db.forbid_transaction("the gateway calls the remote system")
    with tool_span(operation_id=operation_id, trace=trace) as (span, trace):
        return verdict_recorded(
            span,
            _run_queued(
                tenant=tenant, operation_id=operation_id, trace=trace, hook=_test_hook
            ),
        )


def _run_queued(
    *, tenant: Tenant, operation_id: uuid.UUID, trace: Trace, hook: TestHook
) -> GatewayResult:
    operation = Operation.objects.get(tenant=tenant, pk=operation_id)
    if operation.state != OperationState.RESERVED or operation.authorized_at is None:
        return standing(operation)
    values = operation_values(operation)[1] or {}
    fields = [
        FieldValue(
            name=item["name"],
            value=values.get(item["name"]),
            source=item["source"],
            observed_at=dt.datetime.fromisoformat(item["observed_at"]),
        )
        for item in operation.field_provenance or []
    ]
    # The run executes for the agent that queued it, under that agent's own grant
    # (re-checked by the permission check); rows queued before the executor was
    # recorded fall back to the agent that reserved.
    executor = operation.executed_by_agent_id or operation.agent_id
    actor = Actor(type=ActorType.AGENT, id=str(executor)) if executor else SYSTEM
    plan = authorize(
        tenant=tenant,
        operation_id=operation_id,
        lease_token=None,
        fields=fields,
        actor=actor,
        trace=trace,
    )
    return run(
        tenant=tenant,
        plan=plan,
        lease_token=None,
        actor=actor,
        trace=trace,
        hook=hook,
    )


@contextmanager
def tool_span(*, operation_id: uuid.UUID, trace: Trace) -> Iterator[tuple[Span, Trace]]:
    """The gateway's span: a GenAI ``execute_tool`` span (docs/observability.md).

    The tool's name is the operation's action, known once the operation is read:
    ``verdict_recorded`` completes the name and sets the verdict.
    """
    with (
        tracing.child_span(
            gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value,
            parent=trace,
            attributes={
                gen_ai.GEN_AI_OPERATION_NAME: (
                    gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value
                ),
                gen_ai.GEN_AI_TOOL_CALL_ID: str(operation_id),
                # A tool the agent runs through us to call an external API.
                gen_ai.GEN_AI_TOOL_TYPE: "extension",
            },
        ) as (span, current),
        logs.bind(operation_id=operation_id),
    ):
        yield span, current


def verdict_recorded(span: Span, result: GatewayResult) -> GatewayResult:
    """Name the span after the tool; the verdict and reason code as attributes."""
    tool = result.operation.action
    span.update_name(f"{gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value} {tool}")
    span.set_attribute(gen_ai.GEN_AI_TOOL_NAME, tool)
    span.set_attribute("portal.gateway.verdict", result.outcome)
    span.set_attribute("portal.gateway.target", result.operation.target)
    reason = result.reason or result.operation.reason_code
    if reason:
        span.set_attribute("portal.gateway.reason_code", str(reason))
    return result


def run(
    *,
    tenant: Tenant,
    plan: Authorized | Refused | GatewayResult,
    lease_token: int | None,
    actor: Actor,
    trace: Trace,
    hook: TestHook,
) -> GatewayResult:
    """After the checks: the last-moment checks, the call, the verdict, one look."""
    if isinstance(plan, GatewayResult):
        return plan
    if isinstance(plan, Refused):
        return plan.result
    hook("before_call")
    started = begin_call(
        tenant=tenant,
        authorized=plan,
        lease_token=lease_token,
        actor=actor,
        trace=trace,
    )
    if isinstance(started, Refused):
        return started.result
    operation = call(
        tenant=tenant,
        authorized=plan,
        operation=started,
        actor=actor,
        trace=trace,
        hook=hook,
    )
    if (
        operation.state == OperationState.UNKNOWN
        and operation.next_check_at is not None
    ):
        # One look right away; the settle job keeps looking after that.
        recovered = operation_recover(
            tenant=tenant, operation_id=operation.pk, trace=trace
        )
        operation = recovered.operation
        operation.refresh_from_db()
    elif operation.state != OperationState.VERIFIED:
        # Verified is final, and ``call`` returns it as its move's RETURNING row
        # left it; any other outcome may have moved on since (an escalation).
        operation.refresh_from_db()
    if operation.state == OperationState.HUMAN_REQUIRED:
        # Handed to a person after the call (e.g. CREDENTIAL_EXPIRED, retries spent).
        escalation = (
            Escalation.objects.filter(tenant=tenant, operation=operation)
            .order_by("-created_at")
            .first()
        )
        return GatewayResult(
            outcome="refused",
            operation=operation,
            reason=operation.reason_code,
            escalation_id=escalation.pk if escalation else None,
        )
    return standing(operation)
