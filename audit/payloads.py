"""One typed definition of the payload (``Event.payload``, ``data`` of
``event_append``) of each event code, and ``PAYLOADS``, code to definition.

Each is a ``TypedDict`` named after its code: a writer builds the payload by
calling it on a dict literal (``payloads.TaskCommented({...})``), so mypy checks
the keys and the value types, and at run time the call is a plain ``dict``: the
stored JSON, and so the chain's hashes, are what the literal alone would give.
The task transition's hot path annotates its literal instead (no call at all).
A key that is a Python keyword (``from``) needs the functional form.

A family of codes whose events one writer writes with one shape shares one
definition under each code's name (``OperationExecuting`` is ``OperationMoved``).
Keys that only some writers of a code put in are ``NotRequired``;
``TenantChanged``, with ``total=False``, is a code whose writers share no key
(``AgentSet`` and ``OperationExtra``, also ``total=False``, are what a writer
adds to a payload). Nested values the payload copies from elsewhere (a policy
decision, a check's evidence, a transition's caller-given ``data``) stay
``Any``: their shape belongs to their source.
``tests/unit/audit/test_payloads.py`` holds every writer outside tests and
benchmarks to this module.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final, NotRequired, TypedDict

from .models import EventCode

# --- Tasks ---------------------------------------------------------------------


class TaskWorkflow(TypedDict):
    key: str
    version: str


class TaskObject(TypedDict):
    type: str
    id: str
    version: str


class TaskRegistered(TypedDict):
    client_task_id: str
    workflow: TaskWorkflow
    object: TaskObject


# ``from`` and ``step`` are NotRequired: the one-statement write puts them in as
# slots (``slotted_event_params``), after the payload it types was built.
TaskTransitioned = TypedDict(
    "TaskTransitioned",
    {
        "from": NotRequired[str],
        "to": str,
        "state_version": int,
        "step": NotRequired["str | None"],
        "lease_token": int,
        "data": Any,
    },
)
TaskClaimed = TypedDict(
    "TaskClaimed",
    {"from": str, "to": str, "owner": str, "lease_token": int, "state_version": int},
)


class TaskLeaseAcquired(TypedDict):
    owner: str
    lease_token: int
    expires_at: dt.datetime | None
    taken_over_from: str | None


TaskLeaseReleased = TypedDict(
    "TaskLeaseReleased",
    {"owner": "str | None", "lease_token": int, "from": str, "to": str},
)
TaskLeaseExpired = TypedDict(
    "TaskLeaseExpired",
    {"from": str, "to": str, "owner": "str | None", "lease_token": int},
)
TaskWoken = TypedDict("TaskWoken", {"from": str, "to": str, "state_version": int})


class TaskEscalated(TypedDict):
    escalation_id: str
    task_moved: bool
    lease_token: int | None
    evidence: Any


TaskHumanClaimed = TypedDict(
    "TaskHumanClaimed", {"lease_token": int, "from": str, "to": str}
)
TaskHumanReleased = TypedDict(
    "TaskHumanReleased",
    {"from": str, "to": str, "released_for": "str | None", "note": str},
)
TaskResolved = TypedDict(
    "TaskResolved",
    {
        "resolution": str,
        "from": str,
        "to": str,
        "provider_reference": "str | None",
        "note": str,
    },
)


class TaskCommented(TypedDict):
    comment_id: str
    chars: int
    body_digest: str


# --- Operations ----------------------------------------------------------------


class OperationReserved(TypedDict):
    idempotency_key: str
    action: str
    target: str
    input_hash: str
    lease_token: int | None
    policy: NotRequired[dict[str, Any]]  # policies.engine Decision.as_evidence()
    limits: NotRequired[list[Any]]  # limits.services.reservation_admit's charges


class OperationExtra(TypedDict, total=False):
    """What a writer of an operation's move adds to ``OperationMoved``."""

    executed_by: dict[str, str]
    checks: list[dict[str, Any]]
    issued: list[Any]
    retry: bool
    cause: str
    jti: str
    call: str
    answered: str | None
    confirmed: bool
    note: str  # a person's, on the takeover desk


_OperationFacts = TypedDict(
    "_OperationFacts",
    {
        "from": str,
        "to": str,
        "attempts": int,
        "idempotency_key": str,
        "provider_reference": "str | None",
        "lease_token": "int | None",
    },
)


class OperationMoved(_OperationFacts, OperationExtra):
    """An operation's move to a state (tasks.services ``_OUTCOME_EVENTS``): the
    common facts and what the writer adds."""


OperationExecuting = OperationMoved
OperationVerified = OperationMoved
OperationFailed = OperationMoved
OperationUnknown = OperationMoved
OperationConflicted = OperationMoved
OperationEscalated = OperationMoved


class OperationFieldEdit(TypedDict):
    name: str
    source: str
    observed_at: str


class OperationFieldsEdited(TypedDict):
    fields: list[OperationFieldEdit]
    note: str


class OperationApproved(TypedDict):
    approval_id: str
    approval_state: str
    input_hash: str
    idempotency_key: str


# --- The gateway ---------------------------------------------------------------


class GatewayChecked(TypedDict):
    """A check pass (``checks``, and ``check`` on a refusal) or a denial (``check``
    ``limits``, ``phase`` and the refusal's context, which varies with the error:
    see ``limits.services.denial_record``)."""

    verdict: str
    checks: NotRequired[list[Mapping[str, Any]]]
    check: NotRequired[str]
    phase: NotRequired[str]


class ConnectorResult(TypedDict):
    """A connector's answer (tasks.connectors ``CallResult.as_event_data``)."""

    outcome: str
    status: int | None
    error: str
    provider_reference: str | None
    retry_after_s: float | None
    duration_ms: int


class ConnectorCalled(ConnectorResult):
    attempt: int
    credentials_revoked: list[str]


class ReceiptQueried(TypedDict):
    outcome: str
    receipts: list[str]
    count: int
    error: str
    status: NotRequired[int | None]
    lookup: NotRequired[int]
    issued: NotRequired[list[Any]]
    purpose: NotRequired[str]


# --- Tenants, agents, people ---------------------------------------------------


class TableRows(TypedDict):
    table: str
    rows: int


class TenantCreated(TypedDict):
    """The tenant's first event (console/tenants.py ``tenant_open``); the actor is
    the operator, or ``system:tenant_create`` for the command."""

    slug: str
    name: str
    events_on_delete: str
    first_admin: str  # "invitation" (the operator's page) or "account" (command)


class TenantDeleted(TypedDict):
    slug: str
    events_on_delete: str
    revoked: list[TableRows]
    deleted: list[TableRows]
    kept: list[TableRows]


class Revocation(TypedDict):
    """What freezing revoked (``limits.services._revoke``)."""

    revoked_leases: int
    revoked_lease_task_ids: list[str]
    revoked_credentials: int


class TenantChanged(TypedDict, total=False):
    """A rename (``changed``), the retention policy, a freeze (``frozen`` and,
    frozen, ``Revocation``'s keys) or a routing row (``routing``, ``id``,
    ``change``)."""

    changed: dict[str, list[Any]]
    retention_policy: dict[str, list[int]]
    frozen: bool
    revoked_leases: int
    revoked_lease_task_ids: list[str]
    revoked_credentials: int
    routing: str | None  # the routing row's model name
    id: str
    change: str


class AgentCreated(TypedDict):
    agent_id: str
    name: str


class AgentSet(TypedDict, total=False):
    """The agent's columns a person set (console.services ``_agent_change``)."""

    active: bool
    sponsor_id: int | None
    trust_tier: str
    tags: list[str]


class AgentChanged(AgentSet):
    """A column set by a person (``name`` and ``AgentSet``'s keys), a key's expiry,
    a freeze (as ``TenantChanged``'s) or a limit (``change``, ``before``, ``after``)."""

    agent_id: str
    name: NotRequired[str]
    key_prefix: NotRequired[str]
    key_expires_at: NotRequired[list[str | None]]
    frozen: NotRequired[bool]
    agent: NotRequired[str]
    revoked_leases: NotRequired[int]
    revoked_lease_task_ids: NotRequired[list[str]]
    revoked_credentials: NotRequired[int]
    change: NotRequired[str]
    before: NotRequired[dict[str, Any] | None]
    after: NotRequired[dict[str, Any] | None]


class AgentKeyIssued(TypedDict):
    agent_id: str
    key_prefix: str
    agent: NotRequired[str]
    rotated_from: NotRequired[str]
    old_valid_until: NotRequired[str | None]


class AgentKeyRevoked(TypedDict):
    agent_id: str
    key_prefix: str


class AgentKeyRefused(TypedDict):
    code: str
    agent_id: str
    key_prefix: str
    status: str
    address: str
    method: str
    path: str


class AgentGrant(TypedDict):
    agent_id: str
    action: str
    target: str


AgentGrantAdded = AgentGrant
AgentGrantRevoked = AgentGrant


class MembershipRevoked(TypedDict):
    user_id: int
    username: str
    role: str


class MembershipGranted(MembershipRevoked):
    previous_role: str | None
    # When the membership comes from an invitation (console/invitations.py).
    invitation_id: NotRequired[str]


# --- Invitations (console/invitations.py) --------------------------------------


class InvitationSent(TypedDict):
    invitation_id: str
    email: str  # redacted to its keyed hash by event_append
    role: str
    replaced: bool
    expires_at: str


class InvitationAccepted(TypedDict):
    invitation_id: str
    user_id: int
    role: str
    new_account: bool
    already_member: bool


# --- Contracts and connectors --------------------------------------------------


class ContractMoved(TypedDict):
    key: str
    version: int
    to: str


ContractCreated = ContractMoved
ContractPublished = ContractMoved
ContractRetired = ContractMoved


class ConnectorSaved(TypedDict):
    target: str
    changed: dict[str, list[Any]]  # setting: [before, after]
    signing_key_replaced: bool


ConnectorCreated = ConnectorSaved
ConnectorChanged = ConnectorSaved


# --- The trail -----------------------------------------------------------------


class AuditExported(TypedDict):
    """An export of the trail (console.export) or of a task's evidence bundle
    (tasks.evidence, ``format`` ``evidence-bundle``)."""

    format: str
    complete: bool
    rows: NotRequired[int]
    rows_total: NotRequired[int]
    tenants: NotRequired[list[str]]
    filters: NotRequired[dict[str, Any]]
    version: NotRequired[int]
    task_id: NotRequired[str]
    events: NotRequired[int]
    checkpoint_id: NotRequired[str | None]
    sections: NotRequired[list[dict[str, str]]]


class OutboxRow(TypedDict):
    outbox_id: str
    event_id: str
    topic: str
    key: str
    attempts: int


OutboxRetried = OutboxRow
OutboxDismissed = OutboxRow


class AuditPurged(TypedDict):
    purge_id: str
    before_id: str
    events: int
    first_event_id: str | None
    last_event_id: str | None
    anchors: int
    anchors_digest: str


class AuditPayloadsDropped(TypedDict):
    before_id: str
    events: int


# --- Policy sets ---------------------------------------------------------------


class PolicySetFacts(TypedDict):
    version: int
    state: str
    digest: str  # of the text: the trail names it, the row holds it


class PolicySetCreated(PolicySetFacts):
    note: str


PolicySetChanged = PolicySetFacts
PolicySetRetired = PolicySetFacts


class PolicySetPublished(PolicySetFacts):
    retired_version: int | None


# --- The desk's routing --------------------------------------------------------


class DeskItem(TypedDict):
    assignment_id: str
    item_kind: str
    item_id: str
    group_id: str
    person_id: int | None
    told_group_ids: NotRequired[list[str]]
    from_group_id: NotRequired[str]
    from_person_id: NotRequired[int | None]
    taken_over: NotRequired[bool]


DeskItemAssigned = DeskItem
DeskItemReassigned = DeskItem
DeskItemReminded = DeskItem
DeskItemEscalated = DeskItem


# --- Approvals -----------------------------------------------------------------


class ApprovalFacts(TypedDict):
    approval_id: str
    state: str
    input_hash: str
    field_digest: str
    quorum: int
    groups: list[str]


class ApprovalRequested(ApprovalFacts):
    sponsor_excluded: bool
    expires_at: str | None
    asked: Any


class ApprovalDecided(ApprovalFacts):
    verdict: str
    reason: str
    saw: Any
    saw_digest: str


class ApprovalOutcome(ApprovalFacts):
    approvals: int
    approvers: list[str]
    reason: str


ApprovalApproved = ApprovalOutcome
ApprovalRejected = ApprovalOutcome


class ApprovalExpired(ApprovalFacts):
    was: str
    expires_at: str | None


class ApprovalConsumed(ApprovalFacts):
    idempotency_key: str


class ApprovalSuperseded(ApprovalFacts):
    was: str
    seen_field_digest: str


Payload = (
    TaskRegistered
    | TaskTransitioned
    | TaskClaimed
    | TaskLeaseAcquired
    | TaskLeaseReleased
    | OperationReserved
    | OperationMoved
    | TenantCreated
    | TenantDeleted
    | GatewayChecked
    | ConnectorCalled
    | ReceiptQueried
    | OperationApproved
    | TaskEscalated
    | TaskHumanClaimed
    | TaskHumanReleased
    | TaskResolved
    | TaskLeaseExpired
    | TaskWoken
    | TenantChanged
    | AgentCreated
    | AgentChanged
    | AgentKeyIssued
    | AgentKeyRevoked
    | AgentKeyRefused
    | AgentGrant
    | MembershipGranted
    | MembershipRevoked
    | ContractMoved
    | ConnectorSaved
    | AuditExported
    | OutboxRow
    | OperationFieldsEdited
    | AuditPurged
    | AuditPayloadsDropped
    | PolicySetCreated
    | PolicySetFacts
    | PolicySetPublished
    | DeskItem
    | ApprovalRequested
    | ApprovalDecided
    | ApprovalOutcome
    | ApprovalExpired
    | ApprovalConsumed
    | ApprovalSuperseded
    | TaskCommented
    | InvitationSent
    | InvitationAccepted
)
"""Any event's payload: what a writer that takes the code as an argument accepts."""


PAYLOADS: Final[dict[EventCode, type]] = {
    EventCode.TASK_REGISTERED: TaskRegistered,
    EventCode.TASK_TRANSITIONED: TaskTransitioned,
    EventCode.TASK_CLAIMED: TaskClaimed,
    EventCode.TASK_LEASE_ACQUIRED: TaskLeaseAcquired,
    EventCode.TASK_LEASE_RELEASED: TaskLeaseReleased,
    EventCode.OPERATION_RESERVED: OperationReserved,
    EventCode.OPERATION_EXECUTING: OperationExecuting,
    EventCode.OPERATION_VERIFIED: OperationVerified,
    EventCode.OPERATION_FAILED: OperationFailed,
    EventCode.OPERATION_UNKNOWN: OperationUnknown,
    EventCode.TENANT_DELETED: TenantDeleted,
    EventCode.GATEWAY_CHECKED: GatewayChecked,
    EventCode.CONNECTOR_CALLED: ConnectorCalled,
    EventCode.RECEIPT_QUERIED: ReceiptQueried,
    EventCode.OPERATION_CONFLICTED: OperationConflicted,
    EventCode.OPERATION_ESCALATED: OperationEscalated,
    EventCode.OPERATION_APPROVED: OperationApproved,
    EventCode.TASK_ESCALATED: TaskEscalated,
    EventCode.TASK_HUMAN_CLAIMED: TaskHumanClaimed,
    EventCode.TASK_HUMAN_RELEASED: TaskHumanReleased,
    EventCode.TASK_RESOLVED: TaskResolved,
    EventCode.TASK_LEASE_EXPIRED: TaskLeaseExpired,
    EventCode.TASK_WOKEN: TaskWoken,
    EventCode.TENANT_CHANGED: TenantChanged,
    EventCode.AGENT_CREATED: AgentCreated,
    EventCode.AGENT_CHANGED: AgentChanged,
    EventCode.AGENT_KEY_ISSUED: AgentKeyIssued,
    EventCode.AGENT_KEY_REVOKED: AgentKeyRevoked,
    EventCode.AGENT_KEY_REFUSED: AgentKeyRefused,
    EventCode.AGENT_GRANT_ADDED: AgentGrantAdded,
    EventCode.AGENT_GRANT_REVOKED: AgentGrantRevoked,
    EventCode.MEMBERSHIP_GRANTED: MembershipGranted,
    EventCode.MEMBERSHIP_REVOKED: MembershipRevoked,
    EventCode.CONTRACT_CREATED: ContractCreated,
    EventCode.CONTRACT_PUBLISHED: ContractPublished,
    EventCode.CONTRACT_RETIRED: ContractRetired,
    EventCode.CONNECTOR_CREATED: ConnectorCreated,
    EventCode.CONNECTOR_CHANGED: ConnectorChanged,
    EventCode.AUDIT_EXPORTED: AuditExported,
    EventCode.OUTBOX_RETRIED: OutboxRetried,
    EventCode.OUTBOX_DISMISSED: OutboxDismissed,
    EventCode.OPERATION_FIELDS_EDITED: OperationFieldsEdited,
    EventCode.AUDIT_PURGED: AuditPurged,
    EventCode.AUDIT_PAYLOADS_DROPPED: AuditPayloadsDropped,
    EventCode.POLICY_SET_CREATED: PolicySetCreated,
    EventCode.POLICY_SET_CHANGED: PolicySetChanged,
    EventCode.POLICY_SET_PUBLISHED: PolicySetPublished,
    EventCode.POLICY_SET_RETIRED: PolicySetRetired,
    EventCode.DESK_ITEM_ASSIGNED: DeskItemAssigned,
    EventCode.DESK_ITEM_REASSIGNED: DeskItemReassigned,
    EventCode.DESK_ITEM_REMINDED: DeskItemReminded,
    EventCode.DESK_ITEM_ESCALATED: DeskItemEscalated,
    EventCode.APPROVAL_REQUESTED: ApprovalRequested,
    EventCode.APPROVAL_DECIDED: ApprovalDecided,
    EventCode.APPROVAL_APPROVED: ApprovalApproved,
    EventCode.APPROVAL_REJECTED: ApprovalRejected,
    EventCode.APPROVAL_EXPIRED: ApprovalExpired,
    EventCode.APPROVAL_CONSUMED: ApprovalConsumed,
    EventCode.APPROVAL_SUPERSEDED: ApprovalSuperseded,
    EventCode.TASK_COMMENTED: TaskCommented,
    EventCode.INVITATION_SENT: InvitationSent,
    EventCode.INVITATION_ACCEPTED: InvitationAccepted,
    EventCode.TENANT_CREATED: TenantCreated,
}
"""Every code written today to its payload's definition; ``credential.issued``,
no longer written (audit/models.py), has none."""
