"""The append-only event history and the transactional outbox.

Events deliberately reference their task and operation by id, without a foreign key:
the audit trail is the one record designed to outlive its subjects (a deleted tenant's
events may be kept, see docs/tenant-deletion.md). Its integrity comes from the
append-only trigger, not from foreign keys.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Now

from portal.actors import ActorType
from portal.codes import REASON_CODE_DOMAIN, ReasonCode
from portal.domains import DomainCharField, DomainJSONField
from portal.ids import new_id

# The domain that holds EventCode's list (the type of audit_event.code), and its CHECK.
EVENT_CODE_DOMAIN = "audit_event_code"
EVENT_CODE_CHECK = "audit_event_code_check"
# The same for ActorType's list on audit_event.actor_type and OutboxState's on
# audit_outbox.state; their CHECKs keep the names the table CHECKs had.
ACTOR_TYPE_DOMAIN = "audit_event_actor_type"
ACTOR_TYPE_CHECK = "audit_event_actor_type_check"
OUTBOX_STATE_DOMAIN = "audit_outbox_state"
OUTBOX_STATE_CHECK = "audit_outbox_state_check"
# audit_event.payload's type: jsonb, its text at most PORTAL_EVENT_PAYLOAD_MAX_BYTES.
EVENT_PAYLOAD_DOMAIN = "audit_event_payload"
EVENT_PAYLOAD_CHECK = "audit_event_payload_size_check"


class EventCode(models.TextChoices):
    """Dotted lower-case ``<entity>.<past-tense verb>``.

    Append only; never rename or reuse: exported trails depend on it. The list is
    copied by migration into the domain ``audit_event_code`` (``portal/domains.py``
    says how to add one); tests check the copy.
    """

    TASK_REGISTERED = "task.registered"
    TASK_TRANSITIONED = "task.transitioned"
    TASK_CLAIMED = "task.claimed"
    TASK_LEASE_ACQUIRED = "task.lease_acquired"
    TASK_LEASE_RELEASED = "task.lease_released"
    OPERATION_RESERVED = "operation.reserved"
    OPERATION_EXECUTING = "operation.executing"
    OPERATION_VERIFIED = "operation.verified"
    OPERATION_FAILED = "operation.failed"
    OPERATION_UNKNOWN = "operation.unknown"
    TENANT_DELETED = "tenant.deleted"
    GATEWAY_CHECKED = "gateway.checked"
    # Not written since issue 23 (the operation.executing event lists the
    # credentials it issued); kept for the events recorded before.
    CREDENTIAL_ISSUED = "credential.issued"
    CONNECTOR_CALLED = "connector.called"
    RECEIPT_QUERIED = "receipt.queried"
    OPERATION_CONFLICTED = "operation.conflicted"
    OPERATION_ESCALATED = "operation.escalated"
    OPERATION_APPROVED = "operation.approved"
    TASK_ESCALATED = "task.escalated"
    TASK_HUMAN_CLAIMED = "task.human_claimed"
    TASK_HUMAN_RELEASED = "task.human_released"
    TASK_RESOLVED = "task.resolved"
    TASK_LEASE_EXPIRED = "task.lease_expired"
    TASK_WOKEN = "task.woken"
    # Changes people make to a tenant's set-up (the person is the actor).
    TENANT_CHANGED = "tenant.changed"
    AGENT_CREATED = "agent.created"
    AGENT_CHANGED = "agent.changed"
    AGENT_KEY_ISSUED = "agent_key.issued"
    AGENT_KEY_REVOKED = "agent_key.revoked"
    AGENT_KEY_REFUSED = "agent_key.refused"  # a revoked or expired key was used
    AGENT_GRANT_ADDED = "agent_grant.added"
    AGENT_GRANT_REVOKED = "agent_grant.revoked"
    MEMBERSHIP_GRANTED = "membership.granted"
    MEMBERSHIP_REVOKED = "membership.revoked"
    CONTRACT_CREATED = "contract.created"
    CONTRACT_PUBLISHED = "contract.published"
    CONTRACT_RETIRED = "contract.retired"
    CONNECTOR_CREATED = "connector.created"
    CONNECTOR_CHANGED = "connector.changed"
    # Reading and operating the trail.
    AUDIT_EXPORTED = "audit.exported"
    OUTBOX_RETRIED = "outbox.retried"
    OUTBOX_DISMISSED = "outbox.dismissed"
    OPERATION_FIELDS_EDITED = "operation.fields_edited"
    # Retention (audit/retention.py): the tombstone of a purge, and payloads dropped.
    AUDIT_PURGED = "audit.purged"
    AUDIT_PAYLOADS_DROPPED = "audit.payloads_dropped"
    # A tenant's Cedar policy set (policies/): every change names the person.
    POLICY_SET_CREATED = "policy_set.created"
    POLICY_SET_CHANGED = "policy_set.changed"
    POLICY_SET_PUBLISHED = "policy_set.published"
    POLICY_SET_RETIRED = "policy_set.retired"
    # Desk items' routing and SLA (routing/): who has an item, and its clock.
    DESK_ITEM_ASSIGNED = "desk.item_assigned"
    DESK_ITEM_REASSIGNED = "desk.item_reassigned"
    DESK_ITEM_REMINDED = "desk.item_reminded"
    DESK_ITEM_ESCALATED = "desk.item_escalated"
    # Approvals (tasks/approvals.py): asked, each person's decision, the outcome.
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    APPROVAL_APPROVED = "approval.approved"
    APPROVAL_REJECTED = "approval.rejected"
    APPROVAL_EXPIRED = "approval.expired"
    APPROVAL_CONSUMED = "approval.consumed"
    APPROVAL_SUPERSEDED = "approval.superseded"
    # A person's comment on a desk item (console/takeover_desk/comments.py).
    TASK_COMMENTED = "task.commented"
    # Invitations (console/invitations.py): an administrator sent one (the actor);
    # the invited person took it up (the actor), next to the membership.granted
    # event that names the administrator.
    INVITATION_SENT = "invitation.sent"
    INVITATION_ACCEPTED = "invitation.accepted"
    # The platform operator made a tenant (console/tenants.py), its first event.
    TENANT_CREATED = "tenant.created"


class Event(models.Model):
    """One fact in a task's history. UPDATE and DELETE are refused by a trigger.

    The table is range-partitioned by month on ``id`` (UUIDv7, time-ordered;
    migration 0011, docs/retention.md); the retention functions are the only path
    that deletes rows or drops payloads.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of its own: every index of the table leads with tenant_id, and each
    # one more costs every append (docs/performance-log.md, issue 11).
    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.PROTECT, db_index=False
    )
    task_id = models.UUIDField(null=True, blank=True, db_index=False)
    operation_id = models.UUIDField(null=True, blank=True)
    code = DomainCharField(max_length=60, choices=EventCode, domain=EVENT_CODE_DOMAIN)
    actor_type = DomainCharField(
        max_length=10, choices=ActorType, domain=ACTOR_TYPE_DOMAIN
    )
    actor_id = models.CharField(max_length=200)
    reason_code = DomainCharField(
        max_length=40,
        choices=ReasonCode,
        null=True,
        blank=True,
        domain=REASON_CODE_DOMAIN,
    )
    contract_key = models.CharField(max_length=100, null=True, blank=True)
    contract_version = models.PositiveIntegerField(null=True, blank=True)
    # Redacted, bounded facts and references; the size bound is the CHECK
    # audit_event_payload_size_check of the column's domain (migration 0033).
    # NULL once retention dropped it (chain format v2 keeps ``payload_digest``):
    # the column is nullable in the database (migration 0013) but not here, so
    # code that writes events cannot store NULL and readers of live payloads keep
    # their type; the few that show old events check for None.
    payload = DomainJSONField(default=dict, domain=EVENT_PAYLOAD_DOMAIN)
    # SHA-256 of the RFC 8785 canonical payload (chain format v2, audit/chain.py);
    # NULL for format v1 events, whose hash covers the payload itself.
    payload_digest = models.CharField(
        max_length=64, null=True, blank=True, editable=False
    )
    trace_id = models.CharField(max_length=32, blank=True, default="")
    span_id = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    # The hash chain (audit/chain.py, docs/audit-integrity.md): the event's place in
    # its task's or tenant's chain, its predecessor's hash (NULL for the first) and
    # its own. Written by event_append only; NULL here means the row did not come
    # from event_append, which verify_audit reports as inserted.
    chain_seq = models.BigIntegerField(null=True, blank=True, editable=False)
    prev_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)
    hash = models.CharField(max_length=64, null=True, blank=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_event_tenant_id_uniq"
            ),
            # A chain is a line: the lock on its ChainHead row orders appends to one
            # chain. Each partition also has its own unique index on (tenant_id,
            # task_id, chain_seq) and (tenant_id, chain_seq), which find a chain's
            # head; they cannot be unique across partitions (migration 0011).
        ]
        indexes = [
            models.Index(
                fields=["tenant", "task_id", "id"], name="audit_event_task_idx"
            ),
            models.Index(
                fields=["tenant", "operation_id", "id"],
                condition=Q(operation_id__isnull=False),
                name="audit_event_operation_idx",
            ),
            # The event browser: newest first, and its from/until range filter.
            models.Index(
                fields=["tenant", "created_at", "id"], name="audit_event_created_idx"
            ),
            # Search by trace id (an exact comparison; see console/search.py).
            models.Index(fields=["tenant", "trace_id"], name="audit_event_trace_idx"),
            # The browser's code, actor and reason filters, newest first.
            models.Index(
                fields=["tenant", "code", "created_at", "id"],
                name="audit_event_code_idx",
            ),
            models.Index(
                fields=["tenant", "actor_type", "actor_id", "created_at", "id"],
                name="audit_event_actor_idx",
            ),
            models.Index(
                fields=["tenant", "reason_code", "created_at", "id"],
                condition=Q(reason_code__isnull=False),
                name="audit_event_reason_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.code} by {self.actor_type}:{self.actor_id}"


class Checkpoint(models.Model):
    """A signed statement of one chain's head and the tenant's event count.

    ``checkpoint_audit`` writes one row per chain whose head moved since its last
    checkpoint, all rows of one run with the same ``signed_at`` and ``event_count``
    (the tenant's chained events at that snapshot). The Ed25519 signature covers
    every column but ``id`` (audit/checkpoints.py); the private key is never in the
    database. Rows are append-only (trigger), except the tenant purge path.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    # The chain: a task's, or the tenant's own (NULL).
    task_id = models.UUIDField(null=True, blank=True)
    head_seq = models.BigIntegerField()
    head_event_id = models.UUIDField()
    head_hash = models.CharField(max_length=64)
    event_count = models.BigIntegerField()
    signed_at = models.DateTimeField()
    key_id = models.CharField(max_length=16)
    signature = models.CharField(max_length=128)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_checkpoint_tenant_id_uniq"
            ),
        ]
        indexes = [
            # The latest checkpoint of each chain, and of the tenant.
            models.Index(
                fields=["tenant", "task_id", "signed_at"],
                name="audit_checkpoint_chain_idx",
            ),
            models.Index(
                fields=["tenant", "signed_at"], name="audit_checkpoint_signed_idx"
            ),
        ]

    def __str__(self) -> str:
        chain = f"task {self.task_id}" if self.task_id else "tenant"
        return f"checkpoint of {chain} at {self.head_seq}"


class ChainHead(models.Model):
    """Where one chain ends now: its last event's number, id and hash.

    Kept by the database, not by Python: ``event_append``'s statement moves the row
    forward as it inserts the event (an ``UPDATE`` that computes the new link and
    returns it; the first event of a chain makes the row), so the row's lock lines
    up appends to one chain and an append finds its predecessor with one index
    lookup, however many month partitions there are (audit migration 0017). Not
    evidence: ``verify_audit`` and the checkpoints read the events themselves; a
    head row that lies only makes the next append link to the wrong hash, which
    ``verify_audit`` reports. ``head_seq`` is also the chain's event count, purged
    events included.
    """

    id = models.BigAutoField(primary_key=True)
    # The chain's unique index leads with the tenant: no index of its own.
    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.PROTECT, db_index=False
    )
    # The chain: a task's, or the tenant's own (NULL).
    task_id = models.UUIDField(null=True, blank=True)
    head_seq = models.BigIntegerField()
    # NULL while the chain has no event yet (head_seq 0: rows made before 0017).
    head_event_id = models.UUIDField(null=True, blank=True)
    head_hash = models.CharField(max_length=64, null=True, blank=True)
    # The hash head_hash replaced: the new event's prev_hash, which the append's
    # UPDATE … RETURNING can only read from the new row (PostgreSQL 15).
    prev_hash = models.CharField(max_length=64, null=True, blank=True)

    class Meta:
        constraints = [
            # One row per chain; the tenant chain's NULL task is one chain too.
            # The task first (audit migration 0017): the append looks a chain up by
            # (task, tenant), and an index that led with tenant_id, like
            # (tenant_id, id) below, would tie with it on the price the planner puts
            # on row-level security's ``tenant_id = ANY(scope)``; without statistics
            # it then took (tenant_id, id) and filtered the tenant's every head row.
            models.UniqueConstraint(
                fields=["task_id", "tenant"],
                nulls_distinct=False,
                name="audit_chainhead_chain_uniq",
            ),
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_chainhead_tenant_id_uniq"
            ),
        ]

    def __str__(self) -> str:
        chain = f"task {self.task_id}" if self.task_id else "tenant"
        return f"head of {chain} at {self.head_seq}"


class LogEntry(models.Model):
    """One leaf of a tenant's transparency log: the event at ``position``.

    The log (docs/audit-integrity.md, "Transparency log") is an RFC 9162 Merkle tree
    per tenant whose leaves are the events' chain hashes in log order. Positions
    are given by the checkpoint job, not by the append (off the transition's hot
    path): each run appends the events no entry names yet, ordered by id. The
    event's hash is copied here so the tree outlives a dropped partition or
    payload. Append-only (trigger); kept when its tenant is purged (no foreign
    key in the database: the log ends in a signed tombstone, tenant_deletion).
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(
        "portal.Tenant",
        on_delete=models.DO_NOTHING,
        db_index=False,
        db_constraint=False,
    )
    position = models.BigIntegerField()  # 0-based leaf index
    event_id = models.UUIDField()
    event_hash = models.CharField(max_length=64)  # the leaf: 32 bytes, hex

    class Meta:
        constraints = [
            # One leaf per place; the tree's leaves are read in this order.
            models.UniqueConstraint(
                fields=["tenant", "position"], name="audit_logentry_position_uniq"
            ),
            # An event is logged once.
            models.UniqueConstraint(
                fields=["tenant", "event_id"], name="audit_logentry_event_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_logentry_tenant_id_uniq"
            ),
            models.CheckConstraint(
                condition=Q(position__gte=0), name="audit_logentry_position_check"
            ),
        ]

    def __str__(self) -> str:
        return f"log entry {self.position}: event {self.event_id}"


class TreeHead(models.Model):
    """A signed head of a tenant's transparency log: a C2SP ``tlog-checkpoint`` note.

    ``note`` is the whole signed note (body and signature lines, audit/tlog.py);
    ``size`` and ``root_hash`` repeat its body for queries. Written by the
    checkpoint job (audit/checkpoints.py, the one signer), append-only (trigger),
    kept when its tenant is purged, like the leaves (``LogEntry``).
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(
        "portal.Tenant",
        on_delete=models.DO_NOTHING,
        db_index=False,
        db_constraint=False,
    )
    size = models.BigIntegerField()
    root_hash = models.CharField(max_length=64)  # hex
    # The tree's compact range (audit/merkle.py ``compact_extend``): the next run
    # extends it with the new leaves alone. Not evidence: verify_audit recomputes
    # the root from the leaves.
    peaks = models.TextField(blank=True)  # hex hashes, space-separated
    note = models.TextField()
    signed_at = models.DateTimeField()
    key_id = models.CharField(max_length=16)

    class Meta:
        constraints = [
            # One head per size: a run with nothing new signs nothing.
            models.UniqueConstraint(
                fields=["tenant", "size"], name="audit_treehead_size_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_treehead_tenant_id_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"tree head of {self.size} events"


class HeadStamp(models.Model):
    """What vouches for a tree head from outside the portal: a witness's
    cosignature (C2SP ``cosignature/v1`` line, audit/witness.py) or an RFC 3161
    time-stamp token (audit/timestamp.py).

    Written after the head's transaction commits (audit/witness_client.py,
    audit/timestamp.py), append-only (trigger), row-level security by tenant.
    ``tree_head`` references the head in the same tenant (a composite foreign key
    in migration 0023, ``ON DELETE CASCADE`` for the owner's tenant purge).
    """

    class Kind(models.TextChoices):
        COSIGNATURE = "cosignature"
        RFC3161 = "rfc3161"

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant_id = models.UUIDField()
    tree_head = models.ForeignKey(
        TreeHead, on_delete=models.CASCADE, db_constraint=False, db_index=False
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # The witness's name, or the time-stamping authority's URL.
    signer = models.CharField(max_length=255)
    # The cosignature line, or the TSA's TimeStampResp (DER) in base64.
    stamp = models.TextField()
    # The cosignature's timestamp, or the token's genTime.
    stamped_at = models.DateTimeField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "tree_head", "kind", "signer"],
                name="audit_headstamp_uniq",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["cosignature", "rfc3161"]),
                name="audit_headstamp_kind_check",
            ),
        ]
        indexes = [
            models.Index(
                fields=["tenant_id", "kind", "signer"],
                name="audit_headstamp_signer_idx",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} by {self.signer}"


class RetentionPolicy(models.Model):
    """How long one tenant keeps its events and, shorter, their payloads.

    A tenant without a row keeps the defaults (``PORTAL_AUDIT_EVENT_RETENTION_MONTHS``,
    ``PORTAL_AUDIT_PAYLOAD_RETENTION_DAYS``). Events go by whole calendar months
    (UTC): with 12, an event of January 2026 is kept through January 2027 and goes
    from February 2027. Payloads go by days, and only from chain format v2 events
    (their digest stays).
    """

    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.PROTECT, related_name="+"
    )
    event_months = models.PositiveIntegerField()
    payload_days = models.PositiveIntegerField()

    class Meta:
        verbose_name_plural = "retention policies"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"], name="audit_retentionpolicy_tenant_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_retentionpolicy_tenant_id_uniq"
            ),
            models.CheckConstraint(
                condition=Q(event_months__gte=1) & Q(event_months__lte=1200),
                name="audit_retentionpolicy_months_range_check",
            ),
            # Payloads never outlive their events.
            models.CheckConstraint(
                condition=Q(payload_days__gte=1)
                & Q(payload_days__lte=models.F("event_months") * 28),
                name="audit_retentionpolicy_days_range_check",
            ),
        ]

    def __str__(self) -> str:
        return f"events {self.event_months} months, payloads {self.payload_days} days"


class RetentionPurge(models.Model):
    """One purge of one tenant's expired events: what went, up to which id.

    Written only by ``audit_retention_purge`` (owner-only, migration 0012); the
    tombstone event of the same transaction repeats these columns and the SHA-256
    of the purge's anchors, and the chain covers the tombstone. Append-only
    (trigger), except the tenant purge.
    """

    id = models.UUIDField(primary_key=True)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    # Every event of the tenant with an id below this is gone (UUIDv7: a time).
    before_id = models.UUIDField()
    events = models.BigIntegerField()
    first_event_id = models.UUIDField(null=True, blank=True)
    last_event_id = models.UUIDField(null=True, blank=True)
    purged_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_retentionpurge_tenant_id_uniq"
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "before_id"], name="audit_purge_before_idx"),
        ]

    def __str__(self) -> str:
        return f"purge of {self.events} events before {self.before_id}"


class RetentionAnchor(models.Model):
    """Where a purge cut a chain: the hash of the last event it removed.

    Written only by ``audit_retention_purge`` (owner-only, migration 0012) in the
    transaction that writes the purge's tombstone event; the tombstone's payload
    carries the SHA-256 of its anchors (audit/retention.py), so an altered anchor
    is seen by ``verify_audit``. Append-only (trigger), except the tenant purge.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    # The RetentionPurge that wrote it (same tenant; read together by tenant).
    purge_id = models.UUIDField()
    # The chain: a task's, or the tenant's own (NULL).
    task_id = models.UUIDField(null=True, blank=True)
    seq = models.BigIntegerField()
    event_id = models.UUIDField()
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_retentionanchor_tenant_id_uniq"
            ),
        ]
        indexes = [
            models.Index(
                fields=["tenant", "task_id", "seq"], name="audit_anchor_chain_idx"
            ),
            models.Index(fields=["tenant", "purge_id"], name="audit_anchor_purge_idx"),
        ]

    def __str__(self) -> str:
        chain = f"task {self.task_id}" if self.task_id else "tenant"
        return f"anchor of {chain} at {self.seq}"


class OutboxState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    DEAD = "dead"
    # An operator gave up on a dead row (audited): never published, and no longer
    # holding its task's later rows back.
    DISMISSED = "dismissed"


class Outbox(models.Model):
    """A downstream message, written in the same transaction as its event."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # Neither has an index of its own: (tenant_id, id), (tenant_id, key) and
    # (tenant_id, event_id) are unique and serve every lookup, and each index more
    # costs every append (docs/performance-log.md, issue 11).
    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.PROTECT, db_index=False
    )
    event = models.ForeignKey(
        Event,
        on_delete=models.PROTECT,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    topic = models.CharField(max_length=100)
    # Goes out as the message id / Idempotency-Key: consumers dedupe on it. Always
    # the event id (audit_outbox_key_is_event_check).
    key = models.CharField(max_length=200)
    payload = models.JSONField()
    # The envelope's task id, typed: the relay's per-task order key (migration 0016).
    task_id = models.GeneratedField(
        expression=Cast(KT("payload__task_id"), models.UUIDField()),
        output_field=models.UUIDField(null=True),
        db_persist=True,
    )
    state = DomainCharField(
        max_length=10,
        choices=OutboxState,
        default=OutboxState.PENDING,
        domain=OUTBOX_STATE_DOMAIN,
    )
    attempts = models.PositiveIntegerField(default=0)
    # Due from (a back-off pushes it out). Indexed (audit_outbox_due_idx): only the
    # rare failure path moves it.
    available_at = models.DateTimeField(db_default=Now())
    # A relay's claim: no other relay takes the row before then. In no index, so
    # the claim's update is HOT (migration 0029, docs/outbox.md "Row updates").
    leased_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name_plural = "outbox"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="audit_outbox_tenant_id_uniq"
            ),
            # The key is the event id, so (tenant_id, event_id) being unique makes
            # the consumers' dedupe key unique; no index of its own (each index
            # costs every append and every sent mark; migration 0030).
            models.CheckConstraint(
                condition=Q(key=Cast("event_id", models.CharField())),
                name="audit_outbox_key_is_event_check",
            ),
        ]
        indexes = [
            models.Index(
                fields=["available_at", "id"],
                condition=Q(state="pending"),
                name="audit_outbox_due_idx",
            ),
            # The outbox monitor's pending and dead counts and the oldest pending
            # row, per tenant: these rows are few, and this index holds only them.
            models.Index(
                fields=["tenant", "state", "created_at"],
                condition=Q(state__in=["pending", "dead"]),
                name="audit_outbox_unsent_state_idx",
            ),
            # Sent rows are nearly the whole table: the monitor reads only the
            # recent ones (sent in the last hour, delivery lag of the last N), a
            # backward range of this index; created_at rides along for the lag.
            models.Index(
                fields=["tenant", "sent_at"],
                include=["created_at"],
                condition=Q(state="sent"),
                name="audit_outbox_sent_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.topic} [{self.key}] ({self.state})"
