"""A task's evidence bundle: everything recorded about it, checkable offline.

``GET /api/v1/tasks/{id}/evidence`` (the agent of the task's tenant, or a person
holding ``export_trail`` there) and the task page's "Export evidence bundle" in the
admin both return ``task_evidence_bundle``'s JSON (docs/audit-integrity.md,
"Evidence bundles"). The verifiable part is ``chain``, ``checkpoint`` and ``log``
(from ``audit/evidence.py``): ``tools/verify_bundle.py`` checks them with the
published public key, with no access to the portal. The other sections (the task,
its operations with credentials and approvals, receipts, escalations, takeover
decisions) are the rows as read after the chain, for the reader; the export record
binds them all (``export``: the ``audit.exported`` event lists each section's
digest and is proven in the signed tree head), so an edit to any section is
caught and named.

Values that were stored before redaction (an operation's input, call fields and
result, an escalation's evidence) pass through the event redaction, as on the admin
pages. Every export is recorded as an ``audit.exported`` event in the tenant's own
chain (not the task's, which the bundle carries): the export record.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping
from typing import Any, Final

from django.db import transaction

from audit import chain as chain_rules
from audit import evidence as audit_evidence
from audit import payloads
from audit import services as audit_services
from audit.checkpoints import signed_at_text
from audit.models import EventCode
from audit.redaction import redact
from portal import db as portal_db
from portal.actor_names import ActorNames
from portal.actors import Actor
from portal.db import db_now
from portal.models import TenantPerm
from portal.roles import Person, require_tenant_perm, tenant_ids_with_perm

from .exceptions import TaskNotFound
from .models import Approval, Credential, Escalation, Operation, Task

FORMAT: Final = "agent-governance-portal/evidence-bundle"
# 2: chain format v2 events (payload_digest in the content, the payload beside it)
# and the anchor of a chain retention purged. 3: every section bound by the export
# record (``export``), an audit.exported event proven in the signed tree head.
FORMAT_VERSION: Final = 3
# What the export record does not bind: the log that proves it, and itself.
UNBOUND_SECTIONS: Final = frozenset({"log", "export"})
EXPORT_RULES: Final = {
    "binding": "the export record's event (audit.exported, content exactly as "
    "hashed, payload beside it) lists every other section of the bundle but log "
    "and export, each with the SHA-256 hex of its RFC 8785 JSON (integers beyond "
    "2^53-1 as decimal strings), as payload.sections; the event's inclusion proof "
    "(index, proof) leads to the log's signed tree head",
}
# What a verifier needs to know to recompute the chain (audit/chain.py).
CHAIN_RULES: Final = {
    "hash": "sha256",
    "canonicalization": "RFC 8785 (JCS)",
    "link": "hash = SHA-256(prev_hash as 64 lower-case hex digits, or 64 zeros for "
    "the first event, followed by the RFC 8785 JSON of content), hex",
    "payload_digest": "content v 2 holds payload_digest, the SHA-256 hex of the "
    "RFC 8785 JSON of the event's payload (integers beyond 2^53-1 as decimal "
    "strings, as in content v 1), instead of the payload; the payload, null once "
    "retention dropped it, is the event's own field",
    "anchor": "a chain retention purged starts at anchor.seq + 1, its first event "
    "linked to anchor.hash; manage.py verify_audit proves the anchor by the purge's "
    "audit.purged tombstone, the offline verifier cannot",
    "checkpoint_signature": "Ed25519 over the RFC 8785 JSON of the checkpoint's "
    "fields v, tenant_id, task_id, head_seq, head_event_id, head_hash, event_count, "
    "signed_at, key_id",
}
# The events that record a person's decision on the task (tasks/takeover.py).
DECISION_CODES: Final = frozenset(
    {
        EventCode.TASK_HUMAN_CLAIMED,
        EventCode.TASK_HUMAN_RELEASED,
        EventCode.TASK_RESOLVED,
        EventCode.OPERATION_APPROVED,
        EventCode.OPERATION_FIELDS_EDITED,
    }
)
# The events that say what the remote system answered about an operation's receipt.
RECEIPT_CODES: Final = frozenset(
    {
        EventCode.CONNECTOR_CALLED,
        EventCode.RECEIPT_QUERIED,
        EventCode.OPERATION_VERIFIED,
        EventCode.OPERATION_CONFLICTED,
    }
)


def task_get_for_exporter(*, user: Person, task_id: uuid.UUID) -> Task:
    """A task whose evidence the person may export.

    Raises:
        TaskNotFound: no such task in a tenant the person can read.
        PermissionDenied: the person reads the tenant but may not export from it.
    """
    task = (
        Task.objects.filter(
            tenant_id__in=tenant_ids_with_perm(user=user, perm=TenantPerm.VIEW_TRAIL),
            pk=task_id,
        )
        .select_related("tenant")
        .first()
    )
    if task is None:
        raise TaskNotFound(task_id=str(task_id))
    require_tenant_perm(user=user, perm=TenantPerm.EXPORT_TRAIL, tenant=task.tenant)
    return task


def _when(value: dt.datetime | None) -> str | None:
    return signed_at_text(value) if value is not None else None


def _id(value: Any) -> str | None:
    return str(value) if value is not None else None


def _redacted(value: Any, *, tenant_id: uuid.UUID) -> Any:
    """Stored values are redacted when written; redacted again here for rows
    written before that (docs/redaction.md)."""
    if value is None:
        return None
    return redact(
        value if isinstance(value, Mapping) else {"value": value}, tenant_id=tenant_id
    )


def _task_json(task: Task) -> dict[str, Any]:
    return {
        "id": str(task.pk),
        "tenant_id": str(task.tenant_id),
        "client_task_id": task.client_task_id,
        "workflow_key": task.workflow_key,
        "workflow_version": task.workflow_version,
        "contract_key": task.contract_key,
        "contract_version": task.contract_version,
        "object_type": task.object_type,
        "object_id": task.object_id,
        "object_version": task.object_version,
        "state": task.state,
        "state_version": task.state_version,
        "current_step": task.current_step,
        "reason_code": task.reason_code,
        "wake_at": _when(task.wake_at),
        "lease": {
            "owner": task.lease_owner,
            "token": task.lease_token,
            "acquired_at": _when(task.lease_acquired_at),
            "expires_at": _when(task.lease_expires_at),
        },
        "trace_id": task.trace_id,
        "span_id": task.span_id,
        "created_at": _when(task.created_at),
        "updated_at": _when(task.updated_at),
    }


def _event_refs(
    events: list[dict[str, Any]], operation_id: str, codes: frozenset[str]
) -> list[dict[str, Any]]:
    return [
        {"seq": event["seq"], "event_id": event["content"]["id"], "code": code}
        for event in events
        if event["content"]["operation_id"] == operation_id
        and (code := event["content"]["code"]) in codes
    ]


def _operations_json(
    task: Task, events: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The operations (with their credentials and approvals) and their receipts."""
    operations = list(
        Operation.objects.filter(tenant_id=task.tenant_id, task_id=task.pk).order_by(
            "created_at", "id"
        )
    )
    ids = [operation.pk for operation in operations]
    credentials: dict[uuid.UUID, list[dict[str, Any]]] = {pk: [] for pk in ids}
    for credential in Credential.objects.filter(
        tenant_id=task.tenant_id, operation_id__in=ids
    ).order_by("issued_at", "id"):
        credentials[credential.operation_id].append(
            {  # metadata only: the secret's hash never leaves its table
                "id": str(credential.pk),
                "object_type": credential.object_type,
                "object_id": credential.object_id,
                "fields": credential.fields,
                "action": credential.action,
                "target": credential.target,
                "issued_at": _when(credential.issued_at),
                "expires_at": _when(credential.expires_at),
                "revoked_at": _when(credential.revoked_at),
            }
        )
    approvals: dict[uuid.UUID, list[dict[str, Any]]] = {pk: [] for pk in ids}
    for approval in (
        Approval.objects.filter(tenant_id=task.tenant_id, operation_id__in=ids)
        .prefetch_related("decisions")
        .order_by("requested_at", "id")
    ):
        approvals[approval.operation_id].append(
            {  # the whole record: what was asked, who decided, what they saw
                "id": str(approval.pk),
                "state": approval.state,
                "input_hash": approval.input_hash,
                "field_digest": approval.field_digest,
                "groups": list(approval.groups),
                "quorum": approval.quorum,
                "sponsor_excluded": approval.sponsor_excluded,
                "asked": _redacted(approval.asked, tenant_id=approval.tenant_id),
                "requested_at": _when(approval.requested_at),
                "expires_at": _when(approval.expires_at),
                "decided_at": _when(approval.decided_at),
                "approved_by": {
                    "actor_type": "user",
                    "actor_id": _id(approval.approved_by_id),
                },
                "used_at": _when(approval.used_at),
                "decisions": [
                    {
                        "person": {
                            "actor_type": "user",
                            "actor_id": _id(decision.person_id),
                        },
                        "verdict": decision.verdict,
                        "reason": decision.reason,
                        "decided_at": _when(decision.decided_at),
                        "saw": _redacted(decision.saw, tenant_id=approval.tenant_id),
                        "saw_digest": decision.saw_digest,
                    }
                    for decision in sorted(
                        approval.decisions.all(), key=lambda d: (d.decided_at, d.pk)
                    )
                ],
            }
        )
    rows = []
    receipts = []
    for operation in operations:
        rows.append(
            {
                "id": str(operation.pk),
                "idempotency_key": operation.idempotency_key,
                "action": operation.action,
                "target": operation.target,
                "input_hash": operation.input_hash,
                "input": _redacted(operation.input, tenant_id=operation.tenant_id),
                "call_fields": _redacted(
                    operation.call_fields, tenant_id=operation.tenant_id
                ),
                "state": operation.state,
                "state_version": operation.state_version,
                "reason_code": operation.reason_code,
                "attempts": operation.attempts,
                "lookups": operation.lookups,
                "provider_reference": operation.provider_reference,
                "result": _redacted(operation.result, tenant_id=operation.tenant_id),
                "reserved_by_agent_id": _id(operation.agent_id),
                "executed_by_agent_id": _id(operation.executed_by_agent_id),
                "authorized_at": _when(operation.authorized_at),
                "trace_id": operation.trace_id,
                "span_id": operation.span_id,
                "created_at": _when(operation.created_at),
                "updated_at": _when(operation.updated_at),
                "credentials": credentials[operation.pk],
                "approvals": approvals[operation.pk],
            }
        )
        refs = _event_refs(events, str(operation.pk), RECEIPT_CODES)
        if operation.provider_reference or refs:
            receipts.append(
                {
                    "operation_id": str(operation.pk),
                    "idempotency_key": operation.idempotency_key,
                    "target": operation.target,
                    "provider_reference": operation.provider_reference,
                    "operation_state": operation.state,
                    "events": refs,
                }
            )
    return rows, receipts


def _escalations_json(task: Task) -> list[dict[str, Any]]:
    return [
        {
            "id": str(escalation.pk),
            "operation_id": _id(escalation.operation_id),
            "reason_code": escalation.reason_code,
            "evidence": _redacted(escalation.evidence, tenant_id=escalation.tenant_id),
            "responsible_owner": escalation.responsible_owner,
            "created_at": _when(escalation.created_at),
            "resolution": escalation.resolution or None,
            "resolved_by": (
                {"actor_type": "user", "actor_id": str(escalation.resolved_by_id)}
                if escalation.resolved_by_id is not None
                else None
            ),
            "resolved_at": _when(escalation.resolved_at),
        }
        for escalation in Escalation.objects.filter(
            tenant_id=task.tenant_id, task_id=task.pk
        ).order_by("created_at", "id")
    ]


def _decisions_json(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    decisions = []
    for event in events:
        content = event["content"]
        if content["code"] not in DECISION_CODES:
            continue
        payload = audit_evidence.event_payload(event)
        payload = payload if isinstance(payload, dict) else {}
        decisions.append(
            {
                "seq": event["seq"],
                "event_id": content["id"],
                "code": content["code"],
                "by": {
                    "actor_type": content["actor_type"],
                    "actor_id": content["actor_id"],
                },
                "at": content["created_at"],
                "operation_id": content["operation_id"],
                "reason_code": content["reason_code"],
                "resolution": payload.get("resolution"),
                "note": payload.get("note"),
            }
        )
    return decisions


def _actors_json(
    task: Task,
    events: list[dict[str, Any]],
    escalations: list[dict[str, Any]],
    operations: list[dict[str, Any]],
    by: Actor,
) -> list[dict[str, Any]]:
    """Every actor the bundle names (the chain's events, the escalations' and
    approvals' people, the exporter) with its name as the pages show it: the agent's
    name, the person's username, the component for a system actor; None when the
    account is gone. Bound by the export record like every other section."""
    found: set[tuple[str, str]] = {(by.type.value, by.id)}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("actor_type"), str) and isinstance(
                value.get("actor_id"), str
            ):
                found.add((value["actor_type"], value["actor_id"]))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk([event["content"] for event in events])
    walk(escalations)
    walk(operations)
    names = ActorNames(found, tenant_ids=[task.tenant_id])
    return [
        {
            "actor_type": actor_type,
            "actor_id": actor_id,
            "name": names.name(actor_type, actor_id)
            or (actor_id if actor_type == "system" else None),
        }
        for actor_type, actor_id in sorted(found)
    ]


def task_evidence_bundle(*, task: Task, by: Actor) -> dict[str, Any]:
    """The evidence bundle of a task the caller may export (checked by the caller).

    Guarantee: the chain is read after a checkpoint covering its head was signed
    (on demand, ``audit.evidence.task_chain_evidence``); the other sections are read
    after the chain, in one transaction, so they are never older than its last
    event. The export is recorded (``audit.exported``) once the bundle is built.
    Runs outside a transaction.

    Raises:
        SigningKeyMissing: a checkpoint was needed and no signing key is configured.
    """
    portal_db.forbid_transaction("signing a checkpoint takes its own transaction")
    chain = audit_evidence.task_chain_evidence(
        tenant_id=task.tenant_id, task_id=task.pk
    )
    with transaction.atomic():
        task = Task.objects.select_related("tenant").get(
            tenant_id=task.tenant_id, pk=task.pk
        )
        operations, receipts = _operations_json(task, chain.events)
        escalations = _escalations_json(task)
        exported_at = db_now()  # the portal's one clock, as on every other row
    head = chain.events[-1] if chain.events else None
    bundle = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": _when(exported_at),
        "exported_by": {"actor_type": by.type.value, "actor_id": by.id},
        "tenant": {"id": str(task.tenant_id), "slug": task.tenant.slug},
        "task": _task_json(task),
        "operations": operations,
        "receipts": receipts,
        "escalations": escalations,
        "takeover_decisions": _decisions_json(chain.events),
        "actors": _actors_json(task, chain.events, escalations, operations, by),
        "chain": {
            "kind": "task",
            "tenant_id": str(task.tenant_id),
            "task_id": str(task.pk),
            **CHAIN_RULES,
            "length": len(chain.events),
            "head_hash": head["hash"] if head else None,
            "anchor": chain.anchor,
            "events": chain.events,
        },
        "checkpoint": chain.checkpoint,
        "coverage": _coverage(chain),
    }
    # Bind every section so far in the export record, then prove the record (and
    # the chain's events) in a signed tree head: signed on demand, as the chain.
    event_id = _export_record(
        task=task, by=by, chain=chain, sections=section_digests(bundle)
    )
    proven = audit_evidence.export_evidence(
        tenant_id=task.tenant_id, event_id=event_id, events=chain.events
    )
    bundle["log"] = proven.log  # the signed tree head and inclusion proofs (audit)
    bundle["export"] = {**EXPORT_RULES, **proven.export}
    return bundle


def section_digests(bundle: Mapping[str, Any]) -> list[dict[str, str]]:
    """Each bound section's name and the SHA-256 of its RFC 8785 JSON (the payload
    digest's rule), in name order: what the export record lists."""
    return [
        {"section": name, "digest": chain_rules.payload_digest(bundle[name])}
        for name in sorted(bundle)
        if name not in UNBOUND_SECTIONS
    ]


def _coverage(chain: audit_evidence.ChainEvidence) -> dict[str, Any]:
    events, signed, first = len(chain.events), chain.signed_events, chain.first_seq
    last = first + events - 1
    if chain.complete:
        note = f"The checkpoint signs all {events} events of the chain."
    elif chain.checkpoint is None:
        note = "No checkpoint signs this chain yet: export it again in a minute."
    elif signed < events:
        note = (
            f"The checkpoint signs events #{first}-#{first + signed - 1}; the "
            f"{events - signed} newer event(s) are not signed yet: export it again "
            "in a minute."
        )
    else:
        note = (
            f"The checkpoint signs up to #{chain.checkpoint['head_seq']}, the chain as "
            f"stored ends at #{last}: it does not match what was signed."
        )
    if chain.anchor is not None:
        note += (
            f" Retention purged events #1-#{chain.anchor['seq']}; the chain continues "
            "from their anchor, which manage.py verify_audit proves and the offline "
            "verifier cannot."
        )
    return {
        "complete": chain.complete,
        "events": events,
        "signed_events": signed,
        "unsigned_events": max(events - signed, 0),
        "purged_events": chain.anchor["seq"] if chain.anchor else 0,
        "note": note,
    }


@transaction.atomic(durable=True)
def _export_record(
    *,
    task: Task,
    by: Actor,
    chain: audit_evidence.ChainEvidence,
    sections: list[dict[str, str]],
) -> uuid.UUID:
    """The ``audit.exported`` event, in the tenant's chain: who exported which task,
    and the digest of every section of the bundle (the verifier recomputes them)."""
    return audit_services.event_append(
        tenant_id=task.tenant_id,
        code=EventCode.AUDIT_EXPORTED,
        actor=by,
        data=payloads.AuditExported(
            {
                "format": "evidence-bundle",
                "version": FORMAT_VERSION,
                "task_id": str(task.pk),
                "events": len(chain.events),
                "checkpoint_id": chain.checkpoint["id"] if chain.checkpoint else None,
                "complete": chain.complete,
                "sections": sections,
            }
        ),
    )


def evidence_json(bundle: Mapping[str, Any]) -> bytes:
    """The bundle as the file people download and agents receive: UTF-8 JSON."""
    return (json.dumps(bundle, ensure_ascii=False, indent=2) + "\n").encode()


def evidence_filename(task: Task) -> str:
    return f"evidence-task-{task.pk}.json"
