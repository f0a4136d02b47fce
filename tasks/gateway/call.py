"""The call: its credential and body, the last-moment checks, and the call itself.

``begin_call`` commits ``executing`` only after checking again what time can change;
``call`` then calls the remote system with no transaction open, carrying the
operation's own idempotency key, and hands the answer to ``results.record_call``, or,
when the outbound URL policy refused the address, to ``call_refused``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from portal import db as portal_db
from portal import metrics
from portal.actors import Actor, ActorType
from portal.codes import ReasonCode
from portal.db import db_now
from portal.models import Tenant
from portal.tracing import Trace

from .. import escalation, services
from ..connectors import CallResult, RemoteSystem, connector_for
from ..contracts import contract_receipt_required
from ..credentials import (
    USE_EXECUTE,
    USE_LOOKUP,
    body_digest,
    credential_fingerprint,
    credential_mint,
    request_body,
)
from ..models import (
    Connector,
    Contract,
    ContractStatus,
    Credential,
    ObjectVersion,
    Operation,
    OperationState,
    Task,
)
from ..sealed import operation_values
from . import revocation
from .checks import caller_may_execute, refuse, version_conflict_evidence
from .common import TestHook, lock, plan
from .results import Authorized, Refused, credentials_spend, record_call, standing


def payload(operation: Operation, task: Task) -> dict[str, Any]:
    """The request body: a pure function of the operation, so retries send the same.

    Built from the real values, unsealed here (tasks/sealed.py); the stored input
    and call fields are redacted.
    """
    real_input, call_fields = operation_values(operation)
    body = dict(real_input) if isinstance(real_input, dict) else {"input": real_input}
    body["object"] = {"type": task.object_type, "id": task.object_id}
    body["fields"] = call_fields or {}
    return body


# A confirming lookup runs after the call, so its credential outlives the call's.
LOOKUP_EXTRA_TTL_S = 60


def issue_credential(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation,
    connector: Connector,
    ttl_s: int,
    field_names: list[str],
    action: str,
    now: dt.datetime,
    actor: Actor,
    trace: Trace,
    use: str = USE_EXECUTE,
    body: bytes | None = None,
) -> tuple[str, Credential]:
    """Mint a short-lived, single-use credential for one request; store its
    fingerprint only.

    The token names the target (``aud``), the operation's idempotency key, action,
    object and field names, its ``use``, and for ``execute`` the SHA-256 of ``body``,
    the exact bytes the call sends. Writes the ``Credential`` row in the caller's
    transaction; the token itself is returned, never stored. No event of its own:
    the operation's event that uses it records it (``credential_facts``), the
    ``operation.executing`` of the call or the ``receipt.queried`` of a look.
    """
    # A JWT's exp is whole seconds: round up, and keep the row's expiry equal to it,
    # so the portal and the target agree on the instant (and the TTL is never cut).
    exp = math.ceil((now + dt.timedelta(seconds=ttl_s)).timestamp())
    expires_at = dt.datetime.fromtimestamp(exp, tz=dt.UTC)
    credential = Credential(
        tenant=tenant,
        operation=operation,
        object_type=task.object_type,
        object_id=task.object_id,
        fields=field_names,
        action=action,
        target=operation.target,
        expires_at=expires_at,
    )
    claims: dict[str, Any] = {
        "aud": operation.target,
        "iat": int(now.timestamp()),
        "exp": exp,
        "jti": str(credential.pk),
        "tenant": str(tenant.pk),
        "use": use,
        "action": action,
        "idempotency_key": operation.idempotency_key,
        "object_type": task.object_type,
        "object_id": task.object_id,
        "fields": field_names,
    }
    if use == USE_EXECUTE:
        assert body is not None, "an execute credential binds the body it carries"
        claims["body_sha256"] = body_digest(body)
    token = credential_mint(claims=claims, connector=connector)
    credential.secret_hash = credential_fingerprint(token)
    credential.save(force_insert=True)
    return token, credential


def credential_facts(credential: Credential, *, use: str, ttl_s: int) -> dict[str, Any]:
    """What the operation's event says of a credential it issued (never the token)."""
    return {
        "credential_id": str(credential.pk),
        "use": use,
        "action": credential.action,
        "target": credential.target,
        "fields": list(credential.fields),
        "expires_at": credential.expires_at.isoformat(),
        "ttl_s": ttl_s,
    }


def authorize_call(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation,
    connector: Connector,
    ttl_s: int,
    now: dt.datetime,
    actor: Actor,
    trace: Trace,
    receipt_required: bool,
) -> Authorized:
    """Issue what one call needs: an ``execute`` credential bound to the body, and a
    ``lookup`` one for the confirming receipt lookup when the connector has lookup.
    ``receipt_required``: the pinned contract's (``contract_receipt_required``).

    In the caller's transaction; ``operation`` may be moved on afterwards (the
    caller replaces it in the result with ``dataclasses.replace``).
    """
    body = request_body(payload(operation, task))
    field_names = sorted(operation_values(operation)[1] or {})
    token, credential = issue_credential(
        tenant=tenant,
        task=task,
        operation=operation,
        connector=connector,
        ttl_s=ttl_s,
        field_names=field_names,
        action=operation.action,
        now=now,
        actor=actor,
        trace=trace,
        body=body,
    )
    issued = [credential_facts(credential, use=USE_EXECUTE, ttl_s=ttl_s)]
    lookup_token, lookup_credential = None, None
    if connector.supports_lookup:
        lookup_token, lookup_credential = issue_credential(
            tenant=tenant,
            task=task,
            operation=operation,
            connector=connector,
            ttl_s=ttl_s + LOOKUP_EXTRA_TTL_S,
            field_names=[],
            action=operation.action,
            now=now,
            actor=actor,
            trace=trace,
            use=USE_LOOKUP,
        )
        issued.append(
            credential_facts(
                lookup_credential, use=USE_LOOKUP, ttl_s=ttl_s + LOOKUP_EXTRA_TTL_S
            )
        )
    return Authorized(
        operation=operation,
        connector=connector,
        credential_id=credential.pk,
        token=token,
        body=body,
        lookup_credential_id=lookup_credential.pk if lookup_credential else None,
        lookup_token=lookup_token,
        credentials=tuple(issued),
        receipt_required=receipt_required,
    )


@transaction.atomic(durable=True)
def begin_call(
    *,
    tenant: Tenant,
    authorized: Authorized,
    lease_token: int | None,
    actor: Actor,
    trace: Trace,
) -> Operation | Refused:
    """Right before the call, check again what time can change; then ``executing``,
    whose event records this check and the credentials the call carries.

    The credential must still be live (``CREDENTIAL_EXPIRED``) and the object version
    still the one the task read (``VERSION_CONFLICT``): both may have changed since
    the checks committed. What remains is the moment between this commit and the
    request leaving; a remote system that takes a version precondition closes it.
    """
    locked = lock(tenant=tenant, operation_id=authorized.operation.pk)
    assert locked is not None
    task, operation = locked
    if operation.state_version != authorized.operation.state_version:
        # A concurrent delivery of this execution got here first and is calling:
        # report its progress rather than call a second time.
        return Refused(result=standing(operation))
    operation = authorized.operation
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT expires_at > app_now() AND revoked_at IS NULL "
            "FROM tasks_credential WHERE tenant_id = %s AND id = %s",
            [tenant.pk, authorized.credential_id],
        )
        (live,) = cursor.fetchone()
    current = ObjectVersion.objects.filter(
        tenant=tenant, object_type=task.object_type, object_id=task.object_id
    ).first()
    problem: tuple[ReasonCode, str, dict[str, Any]] | None = None
    if not live:
        problem = (
            ReasonCode.CREDENTIAL_EXPIRED,
            "credential",
            {"credential_id": str(authorized.credential_id)},
        )
    elif current is None or current.version != task.object_version:
        evidence = version_conflict_evidence(
            task=task,
            current=current,
            fields=operation.field_provenance
            or [{"name": name} for name in sorted(operation.call_fields or {})],
        )
        problem = (
            ReasonCode.VERSION_CONFLICT,
            "version",
            {**evidence, "when": "between the checks and the call"},
        )
    if problem is not None:
        reason, check, evidence = problem
        operation.refresh_from_db()
        return refuse(
            tenant=tenant,
            task=task,
            operation=operation,
            reason=reason,
            check=check,
            actor=actor,
            trace=trace,
            contract=None,
            **evidence,
        )
    # The last-moment check and the credentials are the executing event's own.
    metrics.gateway_verdict_counted(check="credential", reason=None)
    deadline = dt.timedelta(seconds=settings.PORTAL_EXECUTION_DEADLINE_S)
    return services.operation_move(
        tenant=tenant,
        operation_id=operation.pk,
        to=OperationState.EXECUTING,
        lease_token=lease_token,
        expected_version=None if lease_token is not None else operation.state_version,
        actor=actor,
        trace=trace,
        check_in=deadline,
        data={
            "executed_by": {"type": actor.type, "id": actor.id},
            "checks": [
                {
                    "check": "credential",
                    "verdict": "passed",
                    "credential_id": str(authorized.credential_id),
                }
            ],
            "issued": list(authorized.credentials),
        },
    )


def call(
    *,
    tenant: Tenant,
    authorized: Authorized,
    operation: Operation,
    actor: Actor,
    trace: Trace,
    hook: TestHook,
    remote: RemoteSystem | None = None,
) -> Operation:
    """Call with no transaction open, then record the answer.

    A credential that expired while the remote held the call (``CREDENTIAL_EXPIRED``)
    gets a fresh one under the same key, at most
    ``PORTAL_CREDENTIAL_EXPIRED_RETRIES`` times; then a person, with every call's
    evidence (``credential_renew``). An address the outbound URL policy refuses is
    never called: ``call_refused`` fails the operation (``TARGET_FORBIDDEN``).
    """
    portal_db.forbid_transaction("the gateway calls the remote system")
    remote = remote or connector_for(authorized.connector)
    expired_calls: list[dict[str, Any]] = []
    while True:
        result = remote.execute(
            idempotency_key=operation.idempotency_key,
            credential=authorized.token,
            body=authorized.body,
        )
        hook("after_call")
        if result.kind == "refused":
            return call_refused(
                tenant=tenant,
                authorized=authorized,
                operation=operation,
                result=result,
                actor=actor,
                trace=trace,
            )
        confirmation = None
        if (
            result.kind == "succeeded"
            and remote.supports_lookup
            and authorized.lookup_token is not None
            and authorized.receipt_required
        ):
            confirmation = remote.lookup(
                idempotency_key=operation.idempotency_key,
                credential=authorized.lookup_token,
            )
        operation = record_call(
            tenant=tenant,
            operation=operation,
            result=result,
            confirmation=confirmation,
            actor=actor,
            trace=trace,
            credential_id=authorized.credential_id,
            spent=authorized.credential_ids,
        )
        # A 2xx answer shows the target used the credential up; any other may not
        # have reached its replay cache, so the target hears of the revocation.
        unseen = (
            []
            if result.status and 200 <= result.status < 300
            else [authorized.credential_id]
        )
        if authorized.lookup_credential_id is not None and (
            confirmation is None or confirmation.status != 200
        ):
            unseen.append(authorized.lookup_credential_id)
        if unseen:
            revocation.credentials_notify(
                tenant=tenant,
                connector=authorized.connector,
                credential_ids=unseen,
                remote=remote,
            )
        if not (
            operation.state == OperationState.UNKNOWN
            and operation.reason_code == ReasonCode.CREDENTIAL_EXPIRED
        ):
            return operation
        expired_calls.append(
            {
                "jti": str(authorized.credential_id),
                "status": result.status,
                "error": result.error[:200],
                "duration_ms": result.duration_ms,
            }
        )
        renewed = credential_renew(
            tenant=tenant,
            authorized=authorized,
            operation=operation,
            expired_calls=expired_calls,
            actor=actor,
            trace=trace,
        )
        if isinstance(renewed, Operation):
            return renewed
        authorized, operation = renewed, renewed.operation


@transaction.atomic(durable=True)
def call_refused(
    *,
    tenant: Tenant,
    authorized: Authorized,
    operation: Operation,
    result: CallResult,
    actor: Actor,
    trace: Trace,
) -> Operation:
    """The outbound URL policy refused the connector's address: nothing was sent.

    The operation fails with ``TARGET_FORBIDDEN`` (the same key may run again only
    once the connector is fixed, which a new operation does) and the task goes to a
    person, with a ``gateway.checked`` event (check ``outbound``) saying why, like
    any refusal. The call's credentials are revoked; no notice goes out, as the
    target was never reached. Returns the operation as it stands when someone else
    moved it on first.
    """
    locked = lock(tenant=tenant, operation_id=operation.pk)
    assert locked is not None  # operations are never deleted while in doubt
    task, current = locked
    if current.state_version != operation.state_version:
        return current
    credentials_spend(tenant=tenant, credential_ids=authorized.credential_ids)
    failed = services.operation_move(
        tenant=tenant,
        operation_id=operation.pk,
        to=OperationState.FAILED,
        reason=ReasonCode.TARGET_FORBIDDEN,
        expected_version=operation.state_version,
        actor=actor,
        trace=trace,
        data={"call": "refused"},
    )
    refuse(
        tenant=tenant,
        task=task,
        operation=failed,
        reason=ReasonCode.TARGET_FORBIDDEN,
        check="outbound",
        actor=actor,
        trace=trace,
        contract=None,
        why=result.error,
        base_url=authorized.connector.base_url,
    )
    failed.refresh_from_db()
    return failed


@transaction.atomic(durable=True)
def credential_renew(
    *,
    tenant: Tenant,
    authorized: Authorized,
    operation: Operation,
    expired_calls: list[dict[str, Any]],
    actor: Actor,
    trace: Trace,
) -> Authorized | Operation:
    """After ``CREDENTIAL_EXPIRED``: a fresh credential under the same key, or a person.

    The remote refused the credential, so nothing happened and the same key may run
    again, while the retries (``PORTAL_CREDENTIAL_EXPIRED_RETRIES``) and the
    connector's ``max_attempts`` last, the pinned contract is in force and the
    executor's authority holds. Otherwise the task goes to a person with the
    evidence: each expired call's credential, status and duration, and the TTL.
    Returns the operation as it stands when someone else moved it on first.
    """
    locked = lock(tenant=tenant, operation_id=operation.pk)
    assert locked is not None  # operations are never deleted while in doubt
    task, current = locked
    if current.state_version != operation.state_version:
        return current  # recovery (or a person) got here first
    # The gateway runs only under a pinned contract (ContractRequired otherwise).
    assert task.contract_key is not None
    assert task.contract_version is not None
    contract = Contract.objects.get(
        tenant=tenant, key=task.contract_key, version=task.contract_version
    )
    ttl_s = contract.spec["policy"]["credential_ttl_s"]
    # Recovery retries as the portal; the authority is still the executing agent's.
    executor_id = current.executed_by_agent_id or current.agent_id
    executor = (
        Actor(type=ActorType.AGENT, id=str(executor_id))
        if actor.type == ActorType.SYSTEM and executor_id is not None
        else actor
    )
    problem: ReasonCode | None = None
    why = ""
    if len(expired_calls) > settings.PORTAL_CREDENTIAL_EXPIRED_RETRIES or (
        current.attempts >= authorized.connector.max_attempts
    ):
        problem, why = ReasonCode.CREDENTIAL_EXPIRED, "retries spent"
    elif contract.status == ContractStatus.RETIRED:
        problem, why = ReasonCode.CONTRACT_RETIRED, "no retry under a retired contract"
    elif not caller_may_execute(tenant=tenant, operation=current, actor=executor):
        problem, why = ReasonCode.PERMISSION_REVOKED, "the executor lost its authority"
    if problem is not None:
        escalation.escalate(
            tenant=tenant,
            task=task,
            operation=current,
            reason=problem,
            actor=actor,
            trace=trace,
            evidence={
                "plan": plan(current, task),
                "why": why,
                "attempts": current.attempts,
                "ttl_s": ttl_s,
                "calls": expired_calls,
            },
        )
        current.refresh_from_db()
        return current
    renewed = authorize_call(
        tenant=tenant,
        task=task,
        operation=current,
        connector=authorized.connector,
        ttl_s=ttl_s,
        now=db_now(),
        actor=actor,
        trace=trace,
        receipt_required=contract_receipt_required(contract.spec),
    )
    moved = services.operation_move(
        tenant=tenant,
        operation_id=current.pk,
        to=OperationState.EXECUTING,
        expected_version=current.state_version,
        actor=actor,
        trace=trace,
        check_in=dt.timedelta(seconds=settings.PORTAL_EXECUTION_DEADLINE_S),
        data={
            "retry": True,
            "cause": ReasonCode.CREDENTIAL_EXPIRED,
            "jti": str(renewed.credential_id),
            "executed_by": {"type": actor.type, "id": actor.id},
            "issued": list(renewed.credentials),
        },
    )
    return dataclasses.replace(renewed, operation=moved)
