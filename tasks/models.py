"""Tasks, operations, contracts, credentials and object versions.

The transition tables here are the one source of truth; the database mirrors them in
triggers (migration 0002) and ``tests/db/test_transitions.py`` proves the copy equal.
"""

from __future__ import annotations

from typing import Final

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from portal.codes import REASON_CODE_DOMAIN, ReasonCode
from portal.domains import DomainCharField
from portal.ids import new_id

# The domains that hold the two state lists (the types of the state columns; a
# migration freezes each list, portal/domains.py says why and how to add a value),
# and their CHECKs, which keep the names the table CHECKs had.
TASK_STATE_DOMAIN: Final = "tasks_task_state"
TASK_STATE_CHECK: Final = "tasks_task_state_check"
OPERATION_STATE_DOMAIN: Final = "tasks_operation_state"
OPERATION_STATE_CHECK: Final = "tasks_operation_state_check"


class TaskState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    HUMAN_REQUIRED = "human_required"
    HUMAN_CLAIMED = "human_claimed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class OperationState(models.TextChoices):
    RESERVED = "reserved"
    EXECUTING = "executing"
    VERIFIED = "verified"
    FAILED = "failed"
    UNKNOWN = "unknown"
    CONFLICT = "conflict"
    HUMAN_REQUIRED = "human_required"


class ContractStatus(models.TextChoices):
    DRAFT = "draft"
    PUBLISHED = "published"
    RETIRED = "retired"


_T = TaskState
TASK_TRANSITIONS: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        (_T.PENDING, _T.RUNNING),
        (_T.PENDING, _T.CANCELLED),
        (_T.PENDING, _T.HUMAN_REQUIRED),
        (_T.RUNNING, _T.WAITING),
        (_T.RUNNING, _T.PENDING),  # lease lapsed or handed back: run again
        (_T.RUNNING, _T.SUCCEEDED),
        (_T.RUNNING, _T.FAILED),
        (_T.RUNNING, _T.CANCELLED),
        (_T.RUNNING, _T.HUMAN_REQUIRED),
        (_T.WAITING, _T.PENDING),
        (_T.WAITING, _T.CANCELLED),
        (_T.WAITING, _T.HUMAN_REQUIRED),
        (_T.HUMAN_REQUIRED, _T.HUMAN_CLAIMED),
        (_T.HUMAN_CLAIMED, _T.HUMAN_REQUIRED),  # the person releases the claim
        (_T.HUMAN_CLAIMED, _T.SUCCEEDED),
        (_T.HUMAN_CLAIMED, _T.FAILED),
        (_T.HUMAN_CLAIMED, _T.CANCELLED),
        (_T.HUMAN_CLAIMED, _T.PENDING),  # handed back to automation
    }
)
TASK_TERMINAL_STATES: Final[frozenset[str]] = frozenset(
    {_T.SUCCEEDED, _T.FAILED, _T.CANCELLED}
)

_O = OperationState
OPERATION_TRANSITIONS: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        (_O.RESERVED, _O.EXECUTING),
        (_O.RESERVED, _O.FAILED),  # refused by the gateway before any call
        (_O.RESERVED, _O.HUMAN_REQUIRED),  # needs a person's approval first
        (_O.EXECUTING, _O.VERIFIED),
        (_O.EXECUTING, _O.FAILED),
        (_O.EXECUTING, _O.UNKNOWN),
        (_O.UNKNOWN, _O.VERIFIED),
        (_O.UNKNOWN, _O.FAILED),
        (_O.UNKNOWN, _O.EXECUTING),  # bounded retry with the same key
        (_O.UNKNOWN, _O.CONFLICT),
        (_O.UNKNOWN, _O.HUMAN_REQUIRED),
        (_O.HUMAN_REQUIRED, _O.EXECUTING),  # approved: run once, same key
        (_O.HUMAN_REQUIRED, _O.VERIFIED),  # a person found the receipt
        (_O.HUMAN_REQUIRED, _O.FAILED),
        (_O.CONFLICT, _O.VERIFIED),  # a person settled the conflict with evidence
        (_O.CONFLICT, _O.FAILED),
    }
)


class Contract(models.Model):
    """A versioned field contract. Published versions never change (invariant 8)."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    key = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    spec = models.JSONField()
    status = models.CharField(
        max_length=10, choices=ContractStatus, default=ContractStatus.DRAFT
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    published_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_contract_tenant_id_uniq"
            ),
            # Tasks pin (key, version) through a composite FK onto this.
            models.UniqueConstraint(
                fields=["tenant", "key", "version"],
                name="tasks_contract_key_version_uniq",
            ),
            models.CheckConstraint(
                condition=Q(status__in=ContractStatus.values),
                name="tasks_contract_status_check",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} v{self.version} ({self.status})"


class Task(models.Model):
    """A user-level workflow instance, with its lease and fencing token."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of its own: every index of the table leads with tenant_id, and a
    # state change (never a HOT update: state and lease columns are indexed) adds
    # an entry to each (docs/performance-log.md, issue 11).
    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.PROTECT, db_index=False
    )
    # The agent's own id for the task; registering it again is idempotent.
    client_task_id = models.CharField(max_length=200)
    registration_hash = models.CharField(max_length=64)
    workflow_key = models.CharField(max_length=100)
    workflow_version = models.CharField(max_length=50)
    contract_key = models.CharField(max_length=100, null=True, blank=True)
    contract_version = models.PositiveIntegerField(null=True, blank=True)
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=200)
    object_version = models.CharField(max_length=100)

    state = DomainCharField(
        max_length=20,
        choices=TaskState,
        default=TaskState.PENDING,
        domain=TASK_STATE_DOMAIN,
    )
    state_version = models.PositiveIntegerField(default=1)
    current_step = models.CharField(max_length=100, blank=True, default="")
    wake_at = models.DateTimeField(null=True, blank=True)
    reason_code = DomainCharField(
        max_length=40,
        choices=ReasonCode,
        null=True,
        blank=True,
        domain=REASON_CODE_DOMAIN,
    )

    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    # Rises on every acquisition and on every human claim; never falls (trigger).
    lease_token = models.BigIntegerField(default=0)
    lease_acquired_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    trace_id = models.CharField(max_length=32, blank=True, default="")
    span_id = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_task_tenant_id_uniq"
            ),
            # Registration is idempotent on the agent's own task id.
            models.UniqueConstraint(
                fields=["tenant", "client_task_id"],
                name="tasks_task_client_task_id_uniq",
            ),
            models.CheckConstraint(
                condition=Q(contract_key__isnull=True, contract_version__isnull=True)
                | Q(contract_key__isnull=False, contract_version__isnull=False),
                name="tasks_task_contract_pin_check",
            ),
            models.CheckConstraint(
                condition=Q(lease_owner__isnull=True)
                | Q(lease_expires_at__isnull=False, lease_acquired_at__isnull=False),
                name="tasks_task_lease_complete_check",
            ),
        ]
        indexes = [
            # claim_next takes the oldest pending task: ORDER BY created_at, id
            # LIMIT 1 reads the first entry (without id the whole queue is sorted).
            models.Index(
                fields=["tenant", "created_at", "id"],
                condition=Q(state="pending"),
                name="tasks_task_pending_idx",
            ),
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(lease_owner__isnull=False),
                name="tasks_task_lease_expiry_idx",
            ),
            models.Index(
                fields=["wake_at"],
                condition=Q(state="waiting"),
                name="tasks_task_wake_idx",
            ),
            models.Index(
                fields=["tenant", "state", "updated_at"], name="tasks_task_state_idx"
            ),
            # The task list's and event browser's exact searches (console/search.py).
            models.Index(fields=["tenant", "trace_id"], name="tasks_task_trace_idx"),
            models.Index(fields=["tenant", "object_id"], name="tasks_task_object_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.client_task_id} ({self.state})"


class Operation(models.Model):
    """One side effect a task attempts, under a stable idempotency key."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No single-column indexes on the foreign keys: each has a (tenant_id, …) index
    # (the composite foreign keys' and the lookups'), which every query uses, row-
    # level security giving it the tenant; each index more costs every reservation
    # and every state change (docs/performance.md, "Every index pays for a query").
    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.PROTECT, db_index=False
    )
    task = models.ForeignKey(
        Task,
        on_delete=models.PROTECT,
        db_constraint=False,
        db_index=False,
        related_name="operations",
    )
    idempotency_key = models.CharField(max_length=200)
    action = models.CharField(max_length=100)
    target = models.CharField(max_length=200)
    # SHA-256 of the input in RFC 8785 canonical JSON (tasks/hashing.py).
    input_hash = models.CharField(max_length=64)
    input = models.JSONField()  # redacted; the real one is sealed until settled
    # The agent that reserved it (its grant was checked at the reservation).
    agent = models.ForeignKey(
        "portal.Agent",
        on_delete=models.PROTECT,
        db_constraint=False,
        db_index=False,
        null=True,
        blank=True,
        related_name="+",
    )
    # The agent whose own grant authorised the execution (it may differ from the
    # agent that reserved: whoever holds the task's lease executes under its own
    # grant). A queued run executes for it and re-checks its grant. NULL: not yet
    # authorised, or executed by a person (the events name the person).
    executed_by_agent = models.ForeignKey(
        "portal.Agent",
        on_delete=models.PROTECT,
        db_constraint=False,
        db_index=False,
        null=True,
        blank=True,
        related_name="+",
    )
    # The contract fields the gateway passed on, fixed at the first authorised call
    # so every retry under the same key sends the identical request.
    call_fields = models.JSONField(null=True, blank=True)  # redacted
    # The real input and call fields, encrypted, while a call may still follow;
    # emptied when the operation is settled (tasks/sealed.py, docs/redaction.md).
    sealed = models.TextField(null=True, blank=True, editable=False)
    # Queued execution: the checks passed at authorized_at under this fencing token;
    # the worker that runs it re-checks what time can change, from this provenance
    # (name, source, observed_at of every field the agent gave), and runs only while
    # nobody took the task over (the task's token is still authorized_token).
    authorized_at = models.DateTimeField(null=True, blank=True)
    authorized_token = models.BigIntegerField(null=True, blank=True)
    field_provenance = models.JSONField(null=True, blank=True)
    state = DomainCharField(
        max_length=20,
        choices=OperationState,
        default=OperationState.RESERVED,
        domain=OPERATION_STATE_DOMAIN,
    )
    state_version = models.PositiveIntegerField(default=1)
    reason_code = DomainCharField(
        max_length=40,
        choices=ReasonCode,
        null=True,
        blank=True,
        domain=REASON_CODE_DOMAIN,
    )
    attempts = models.PositiveIntegerField(default=0)
    # Receipt lookups made while the result was in doubt (the recovery budget).
    lookups = models.PositiveIntegerField(default=0, db_default=0)
    # When recovery may look at this operation next (also its claim by a runner).
    next_check_at = models.DateTimeField(null=True, blank=True)
    provider_reference = models.CharField(max_length=200, null=True, blank=True)
    result = models.JSONField(null=True, blank=True)  # redacted
    trace_id = models.CharField(max_length=32, blank=True, default="")
    span_id = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_operation_tenant_id_uniq"
            ),
            # A retried reservation must not make a second operation.
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                name="tasks_operation_idempotency_key_uniq",
            ),
            models.CheckConstraint(
                condition=~Q(state="verified") | Q(provider_reference__isnull=False),
                name="tasks_operation_verified_has_receipt_check",
            ),
            # A settled operation makes no more calls: its real values are gone.
            models.CheckConstraint(
                condition=Q(sealed__isnull=True)
                | ~Q(state__in=["verified", "failed", "conflict"]),
                name="tasks_operation_sealed_open_only_check",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "task"], name="tasks_operation_task_idx"),
            # The settle job's queue: in doubt, or queued for a worker.
            models.Index(
                fields=["next_check_at"],
                condition=Q(next_check_at__isnull=False),
                name="tasks_operation_in_doubt_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.target} [{self.idempotency_key}] ({self.state})"


class Credential(models.Model):
    """A short-lived grant scoped to one operation. Its secret is never stored."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    operation = models.ForeignKey(
        Operation,
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name="credentials",
    )
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=200)
    fields = models.JSONField(default=list)
    action = models.CharField(max_length=100)
    target = models.CharField(max_length=200)
    secret_hash = models.CharField(max_length=64)
    issued_at = models.DateTimeField(db_default=Now(), editable=False)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_credential_tenant_id_uniq"
            ),
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("issued_at")),
                name="tasks_credential_expiry_check",
            ),
        ]

    def __str__(self) -> str:
        return f"credential {self.action} {self.target} until {self.expires_at}"


class ObjectVersion(models.Model):
    """The current version of a business object, as the gateway sees it at write."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=200)
    version = models.CharField(max_length=100)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_objectversion_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "object_type", "object_id"],
                name="tasks_objectversion_object_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.object_type}/{self.object_id} @ {self.version}"


class ConnectorKind(models.TextChoices):
    HTTP_JSON = "http_json"


class Connector(models.Model):
    """How the gateway reaches one write target of a tenant.

    Capabilities decide what is automatic: without idempotency keys *and* lookup, a
    repeated call could duplicate a side effect and a lost answer could never be
    settled, so every write needs a person's one-time approval first.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    target = models.CharField(max_length=200)
    kind = models.CharField(
        max_length=20, choices=ConnectorKind, default=ConnectorKind.HTTP_JSON
    )
    base_url = models.URLField(max_length=500)
    execute_path = models.CharField(max_length=200, default="/tickets")
    lookup_path = models.CharField(max_length=200, default="/tickets")
    # The receipt id in a successful answer (a top-level key of the JSON body).
    reference_field = models.CharField(max_length=100, default="ticket_id")
    supports_idempotency_keys = models.BooleanField(default=True)
    supports_lookup = models.BooleanField(default=True)
    connect_timeout_s = models.FloatField(default=2.0)
    read_timeout_s = models.FloatField(default=5.0)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    # Signs the short-lived credentials sent to this target (EdDSA JWTs,
    # tasks/credentials.py). The portal makes the Ed25519 pair; the target holds the
    # public key (base64url, 32 bytes) and finds it by ``key_id``, its RFC 7638
    # thumbprint. The private key is kept only sealed under a key derived from the
    # server secret, outside the database (tasks/sealed.py): no SELECT reads it.
    key_id = models.CharField(max_length=43, editable=False)
    public_key = models.CharField(max_length=43, editable=False)
    sealed_private_key = models.TextField(editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_connector_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "target"], name="tasks_connector_target_uniq"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=ConnectorKind.values),
                name="tasks_connector_kind_check",
            ),
            # Key material has one shape each: a 32-byte public key and its
            # thumbprint in base64url, and the private key only as a sealed
            # envelope (v1, nonce + 32 encrypted bytes + tag), never a clear key.
            models.CheckConstraint(
                condition=Q(public_key__regex=r"^[A-Za-z0-9_-]{43}$")
                & Q(key_id__regex=r"^[A-Za-z0-9_-]{43}$"),
                name="tasks_connector_public_key_check",
            ),
            models.CheckConstraint(
                condition=Q(sealed_private_key__regex=r"^v1:[A-Za-z0-9+/]{80}$"),
                name="tasks_connector_sealed_private_key_check",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.target} -> {self.base_url}"

    @property
    def automatic_writes(self) -> bool:
        return self.supports_idempotency_keys and self.supports_lookup


class Escalation(models.Model):
    """Why a task went to a person, with the evidence they need to decide.

    One row per hand-over: the plan the agent proposed, what the gateway saw (the
    current object version, the conflicting fields, the receipts found) and who is
    responsible. Resolved by a person through the takeover services.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    task = models.ForeignKey(
        Task, on_delete=models.PROTECT, db_constraint=False, related_name="escalations"
    )
    operation = models.ForeignKey(
        Operation,
        on_delete=models.PROTECT,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="escalations",
    )
    reason_code = DomainCharField(
        max_length=40, choices=ReasonCode, domain=REASON_CODE_DOMAIN
    )
    evidence = models.JSONField(default=dict)
    responsible_owner = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        "auth.User", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    resolution = models.CharField(max_length=20, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_escalation_tenant_id_uniq"
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "task"], name="tasks_escalation_task_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.reason_code} on {self.task_id}"


class ApprovalState(models.TextChoices):
    WAITING = "waiting"  # asked; fewer approvals than the quorum so far
    APPROVED = "approved"  # the quorum approved; the next execute may use it
    REJECTED = "rejected"  # one approver rejected it, with a reason
    EXPIRED = "expired"  # its validity window passed first: not a rejection
    CONSUMED = "consumed"  # an execution used it; it answers nothing else
    # The gateway saw other field values than it was asked for: a new one is asked.
    SUPERSEDED = "superseded"


APPROVAL_TRANSITIONS: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        (ApprovalState.WAITING, ApprovalState.APPROVED),
        (ApprovalState.WAITING, ApprovalState.REJECTED),
        (ApprovalState.WAITING, ApprovalState.EXPIRED),
        (ApprovalState.APPROVED, ApprovalState.CONSUMED),
        (ApprovalState.APPROVED, ApprovalState.EXPIRED),
        (ApprovalState.WAITING, ApprovalState.SUPERSEDED),
        (ApprovalState.APPROVED, ApprovalState.SUPERSEDED),
    }
)
"""Mirrored by ``tasks_approval_guard`` (migration 0021); consumed is final."""


class Approval(models.Model):
    """A request for people's permission to execute one operation's exact input
    (``input_hash``) with the exact field values the gateway saw (``field_digest``),
    once, within a validity window; decided by ``quorum`` distinct approvers
    (tasks/approvals.py, docs/approvals.md)."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    operation = models.ForeignKey(
        Operation,
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name="approvals",
    )
    input_hash = models.CharField(max_length=64)
    # SHA-256 of the RFC 8785 list of (name, source, value digest) of the checked
    # fields; empty for an approval a person gave at the desk without a request
    # (a retry after RESULT_UNKNOWN), which binds to the input alone.
    field_digest = models.CharField(max_length=64, blank=True, default="")
    # The groups (routing.Group names) an approver must belong to (any of them);
    # empty: anyone with the desk role.
    groups = models.JSONField(default=list, blank=True)
    quorum = models.PositiveSmallIntegerField(default=1)
    sponsor_excluded = models.BooleanField(default=False)
    # What is asked, as the approvers see it: action, target, redacted arguments,
    # the policy that asked.
    asked = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=10, choices=ApprovalState, default=ApprovalState.APPROVED
    )
    # The person whose decision settled it (the last approver, or the rejecter).
    approved_by = models.ForeignKey(
        "auth.User", on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    requested_at = models.DateTimeField(db_default=Now(), editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_approval_tenant_id_uniq"
            ),
            # At most one open approval per operation: asking twice adds nothing.
            models.UniqueConstraint(
                fields=["tenant", "operation"],
                condition=Q(state__in=["waiting", "approved"]),
                name="tasks_approval_one_open_uniq",
            ),
            models.CheckConstraint(
                condition=Q(state__in=ApprovalState.values),
                name="tasks_approval_state_check",
            ),
            # Consumed exactly when used; a quorum of at least one.
            models.CheckConstraint(
                condition=Q(state="consumed", used_at__isnull=False)
                | (~Q(state="consumed") & Q(used_at__isnull=True)),
                name="tasks_approval_used_iff_consumed",
            ),
            models.CheckConstraint(
                condition=Q(quorum__gte=1), name="tasks_approval_quorum_min"
            ),
        ]
        indexes = [
            models.Index(
                fields=["tenant", "state", "requested_at"],
                name="tasks_approval_waiting_idx",
                condition=Q(state="waiting"),
            )
        ]

    def __str__(self) -> str:
        return f"approval of {self.operation_id} ({self.state})"


class ApprovalVerdict(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"


class ApprovalDecision(models.Model):
    """One person's decision on an approval, with what they saw. Append only."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    approval = models.ForeignKey(
        Approval,
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name="decisions",
    )
    person = models.ForeignKey("auth.User", on_delete=models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=10, choices=ApprovalVerdict)
    reason = models.TextField(blank=True, default="")
    decided_at = models.DateTimeField(db_default=Now(), editable=False)
    # What the person was shown (redacted) and its SHA-256 (RFC 8785).
    saw = models.JSONField(default=dict)
    saw_digest = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="tasks_approvaldecision_tenant_id_uniq"
            ),
            # Distinct people: one decision per person per approval.
            models.UniqueConstraint(
                fields=["tenant", "approval", "person"],
                name="tasks_approvaldecision_once_uniq",
            ),
            models.CheckConstraint(
                condition=Q(verdict__in=ApprovalVerdict.values),
                name="tasks_approvaldecision_verdict_check",
            ),
            models.CheckConstraint(
                condition=Q(verdict="approve") | ~Q(reason=""),
                name="tasks_approvaldecision_reject_reason",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.verdict} of {self.approval_id} by {self.person_id}"
