"""The call: its credential and body, the last-moment checks, and the call itself.

``begin_call`` commits ``executing`` only after checking again what time can change;
``call`` then calls the remote system with no transaction open, carrying the
operation's own idempotency key, and hands the answer to ``results.record_call``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.models import Tenant
from portal.tracing import Trace

from .. import services
from ..connectors import RemoteSystem, connector_for
from ..credentials import credential_fingerprint, credential_mint
from ..models import (
    Connector,
    Contract,
    Credential,
    ObjectVersion,
    Operation,
    OperationState,
    Task,
)
from .checks import checked, refuse, version_conflict_evidence
from .common import TestHook, lock
from .results import Authorized, Refused, record_call, standing


def payload(operation: Operation, task: Task) -> dict[str, Any]:
    """The request body: a pure function of the operation, so retries send the same."""
    body = (
        dict(operation.input)
        if isinstance(operation.input, dict)
        else {"input": operation.input}
    )
    body["object"] = {"type": task.object_type, "id": task.object_id}
    body["fields"] = operation.call_fields or {}
    return body


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
) -> tuple[str, Credential]:
    """Mint a short-lived credential scoped to this call; store its fingerprint only.

    Writes the ``Credential`` row and a ``credential.issued`` event in the caller's
    transaction; the token itself is returned, never stored.
    """
    expires_at = now + dt.timedelta(seconds=ttl_s)
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
    token = credential_mint(
        claims={
            "tenant": str(tenant.pk),
            "object_type": task.object_type,
            "object_id": task.object_id,
            "fields": field_names,
            "action": action,
            "target": operation.target,
            "exp": int(expires_at.timestamp()),
            "jti": str(credential.pk),
        },
        key=connector.signing_key,
    )
    credential.secret_hash = credential_fingerprint(token)
    credential.save(force_insert=True)
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.CREDENTIAL_ISSUED,
        actor=actor,
        task_id=task.pk,
        operation_id=operation.pk,
        trace=trace,
        data={
            "credential_id": str(credential.pk),
            "action": action,
            "target": operation.target,
            "fields": field_names,
            "expires_at": expires_at.isoformat(),
            "ttl_s": ttl_s,
        },
        publish=False,
    )
    return token, credential


@transaction.atomic(durable=True)
def begin_call(
    *,
    tenant: Tenant,
    authorized: Authorized,
    lease_token: int | None,
    actor: Actor,
    trace: Trace,
) -> Operation | Refused:
    """Right before the call, check again what time can change; then ``executing``.

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
    checked(
        tenant=tenant,
        operation=operation,
        check="credential",
        reason=None,
        actor=actor,
        trace=trace,
        contract=None,
        credential_id=str(authorized.credential_id),
    )
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
    """Call with no transaction open, then record the answer."""
    portal_db.forbid_transaction("the gateway calls the remote system")
    remote = remote or connector_for(authorized.connector)
    result = remote.execute(
        idempotency_key=operation.idempotency_key,
        credential=authorized.token,
        payload=authorized.payload,
    )
    hook("after_call")
    confirmation = None
    if (
        result.kind == "succeeded"
        and remote.supports_lookup
        and (receipt_required(operation))
    ):
        confirmation = remote.lookup(
            idempotency_key=operation.idempotency_key, credential=authorized.token
        )
    return record_call(
        tenant=tenant,
        operation=operation,
        result=result,
        confirmation=confirmation,
        actor=actor,
        trace=trace,
    )


def receipt_required(operation: Operation) -> bool:
    """Whether the pinned contract asks for a verified receipt (the seed's default)."""
    task = Task.objects.only("tenant_id", "contract_key", "contract_version").get(
        tenant_id=operation.tenant_id, pk=operation.task_id
    )
    if task.contract_key is None or task.contract_version is None:
        return True
    contract = Contract.objects.only("spec").get(
        tenant_id=task.tenant_id, key=task.contract_key, version=task.contract_version
    )
    return bool(contract.spec["receipt"]["required"])
