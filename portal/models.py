"""Tenancy and identity: tenants, agents and their keys, memberships.

Every tenant-owned table has ``UNIQUE (tenant_id, id)`` so that children can point at
it with a composite foreign key (docs/architecture.md, invariant 1); the composite
keys themselves are added by hand-written migrations.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower, Now

from .ids import new_id


class EventsOnDelete(models.TextChoices):
    """What tenant deletion does with the audit trail."""

    KEEP = "keep", "Keep events (tenant row stays as a tombstone)"
    PURGE = "purge", "Purge events with the tenant"


class TenantPerm(models.TextChoices):
    """Object permissions on a tenant (codenames of ``Tenant.Meta.permissions``)."""

    VIEW_TRAIL = "view_trail", "Read tasks, operations, escalations and events"
    EXPORT_TRAIL = "export_trail", "Export the audit trail"
    WORK_TAKEOVER = "work_takeover", "Claim, release and resolve takeover tasks"
    RELEASE_ANY_CLAIM = "release_any_claim", "Release another person's stale claim"
    MANAGE_TENANT = (
        "manage_tenant",
        "Manage contracts, agents, keys, grants, connectors, members and settings",
    )
    MANAGE_OUTBOX = "manage_outbox", "Retry or dismiss dead outbox rows"


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    events_on_delete = models.CharField(
        max_length=10, choices=EventsOnDelete, default=EventsOnDelete.KEEP
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    # Set when the tenant was deleted and its events kept (EventsOnDelete.KEEP).
    deleted_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The kill switch (limits/services.py, docs/limits.md): while set, every call
    # of the tenant's agents is refused (TENANT_FROZEN). Who froze it: the event.
    frozen_at = models.DateTimeField(null=True, blank=True, editable=False)
    frozen_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        editable=False,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(events_on_delete__in=EventsOnDelete.values),
                name="portal_tenant_events_on_delete_check",
            ),
        ]
        # Object permissions (django-guardian) that membership roles carry;
        # portal/roles.py maps roles to them.
        permissions = [(perm.value, perm.label) for perm in TenantPerm]

    def __str__(self) -> str:
        return self.slug


class TrustTier(models.TextChoices):
    """How far a tenant trusts an agent; its policies read it (docs/policies.md)."""

    RESTRICTED = "restricted"
    STANDARD = "standard"
    TRUSTED = "trusted"


class Agent(models.Model):
    """An API identity of one tenant: a program that calls the REST API."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="agents")
    name = models.CharField(max_length=200)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    # The kill switch (limits/services.py, docs/limits.md): while set, every call
    # is refused (AGENT_FROZEN); read in the key lookup's one statement.
    frozen_at = models.DateTimeField(null=True, blank=True, editable=False)
    frozen_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        editable=False,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # The person answerable for the agent; a policy's @separate_from_sponsor keeps
    # them out of approving its operations (docs/approvals.md).
    sponsor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    # What the tenant's Cedar policies read of the agent besides its name and
    # sponsor (principal.trust_tier, principal.tags; docs/policies.md).
    trust_tier = models.CharField(
        max_length=20, choices=TrustTier, default=TrustTier.STANDARD
    )
    tags = ArrayField(
        models.CharField(max_length=50),
        size=20,
        default=list,
        blank=True,
        help_text=(
            "Comma-separated words a policy can test: "
            'principal.tags.contains("refunds").'
        ),
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="portal_agent_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "name"], name="portal_agent_name_uniq"
            ),
            models.CheckConstraint(
                condition=Q(trust_tier__in=TrustTier.values),
                name="portal_agent_trust_tier_check",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_authenticated(self) -> bool:
        """An agent is the authenticated principal of its requests (DRF reads it)."""
        return True


class AgentKey(models.Model):
    """An agent's API key, stored only as a SHA-256 hash behind a lookup prefix.

    Keys are 256-bit random secrets, so a fast hash is enough: there is nothing to
    brute-force that a slow hash would protect.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT)
    agent = models.ForeignKey(
        Agent, on_delete=models.PROTECT, db_constraint=False, related_name="keys"
    )
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Optional: from this instant on (database clock) the key authenticates nobody.
    # Rotation sets it on the old key, so both keys work until the cutoff.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="portal_agentkey_tenant_id_uniq"
            ),
            models.CheckConstraint(
                condition=Q(expires_at__isnull=True)
                | Q(expires_at__gt=models.F("created_at")),
                name="portal_agentkey_expiry_check",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}…"


class Role(models.TextChoices):
    REVIEWER = "reviewer", "Compliance reviewer"
    SUPPORT = "support", "Support staff"
    ADMIN = "admin", "Tenant administrator"


class Membership(models.Model):
    """A Django user's role in one tenant."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="memberships"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="portal_membership_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "user"], name="portal_membership_user_uniq"
            ),
            models.CheckConstraint(
                condition=Q(role__in=Role.values), name="portal_membership_role_check"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} · {self.role} · {self.tenant}"


class Invitation(models.Model):
    """An e-mailed offer of a role in one tenant, taken up once through its link.

    Only the SHA-256 hash of the link's token is stored (a 256-bit random secret, as
    for agent keys). At most one open invitation per tenant and address: inviting
    the address again gives the open one a new token, role and expiry, so the older
    link stops working (console/invitations.py, docs/portal.md).
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="invitations"
    )
    email = models.EmailField(max_length=254)  # lower-cased
    role = models.CharField(max_length=20, choices=Role)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    # On the database clock (app_now()), like every expiry.
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True, editable=False)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="portal_invitation_tenant_id_uniq"
            ),
            # One open invitation per address: a second invite replaces the first.
            models.UniqueConstraint(
                fields=["tenant", "email"],
                condition=Q(accepted_at__isnull=True),
                name="portal_invitation_open_uniq",
            ),
            models.CheckConstraint(
                condition=Q(role__in=Role.values), name="portal_invitation_role_check"
            ),
            models.CheckConstraint(
                condition=Q(email=Lower("email")),
                name="portal_invitation_email_lower_check",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.email} · {self.role} · {self.tenant}"


class AgentGrant(models.Model):
    """What an agent may do: one action on one target (``*`` matches any target).

    Checked at reservation and again by the gateway at execution time, so revoking a
    grant stops work that is already queued (``PERMISSION_REVOKED``).
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT)
    agent = models.ForeignKey(
        Agent, on_delete=models.PROTECT, db_constraint=False, related_name="grants"
    )
    action = models.CharField(max_length=100)
    target = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="portal_agentgrant_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "agent", "action", "target"],
                name="portal_agentgrant_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent} may {self.action} on {self.target}"


class IdempotentRequestState(models.TextChoices):
    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"


class IdempotentRequest(models.Model):
    """A POST made under an ``Idempotency-Key`` header, and the answer it got.

    Scoped per agent. A replay with the same fingerprint (method, path, body) gets the
    stored answer; another fingerprint is refused; a duplicate that arrives while the
    first is still running is told so. Rows expire after
    ``PORTAL_IDEMPOTENCY_WINDOW_S``; an in-flight row whose holder died is taken over
    after ``locked_until``.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, db_constraint=False)
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=10, choices=IdempotentRequestState)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, default="")
    response_content_type = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    locked_until = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="portal_idempotentrequest_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "agent", "key"],
                name="portal_idempotentrequest_key_uniq",
            ),
            models.CheckConstraint(
                condition=Q(state__in=IdempotentRequestState.values),
                name="portal_idempotentrequest_state_check",
            ),
        ]
        indexes = [
            models.Index(fields=["expires_at"], name="portal_idemp_expiry_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"


class AuthFailureWindow(models.Model):
    """Failed API authentications in the current fixed window, per bucket.

    A bucket is ``addr:<source address>`` or ``prefix:<key prefix>``: no tenant (the
    caller is not known), no key material (a prefix names a key, it opens nothing).
    Counted by one statement on the database clock (``portal.api``), so every web
    process counts against one number. ``UNLOGGED`` (migration 0013): a crash
    empties it, which at worst restarts the window.
    """

    bucket = models.CharField(max_length=100, primary_key=True)
    window_start = models.DateTimeField()
    failures = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.bucket}: {self.failures}"


class AgentRequestWindow(models.Model):
    """An agent's API requests in the current fixed window: the shared throttle.

    One row per agent, moved to the next window by the same statement that counts
    (the key lookup's ``portal_agent_key_authenticate``, for
    ``portal.api.AgentRateThrottle``), so every web process counts against one
    number. The table is ``UNLOGGED`` (migration 0010): a crash empties it, which
    at worst restarts the window; nothing else depends on it.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT)
    agent = models.ForeignKey(
        Agent, on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    window_start = models.DateTimeField()
    requests = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="portal_agentrequestwindow_tenant_id_uniq"
            ),
            # One row per agent: the statement's ON CONFLICT target.
            models.UniqueConstraint(
                fields=["tenant", "agent"], name="portal_agentrequestwindow_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}: {self.requests} since {self.window_start}"


class JobOutcome(models.TextChoices):
    SUCCESS = "success"
    FAILURE = "failure"


class JobRun(models.Model):
    """The last run of each Celery job, whoever started it (beat, a nudge, a test).

    One row per job name, moved by one upsert at the end of the job in the worker
    that ran it (``config.celery.ScopedTask``, ``portal.jobruns``): the workers page
    (console/workers.py) reads from it when beat's jobs last ran and how. Not a
    tenant's row: a job serves every tenant. A row is at most a second old per
    worker process for a job that runs more often (a failure is always written).
    """

    name = models.CharField(max_length=200, primary_key=True)
    finished_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    outcome = models.CharField(max_length=10, choices=JobOutcome)
    worker = models.CharField(max_length=200, blank=True, default="")
    error = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(outcome__in=JobOutcome.values),
                name="portal_jobrun_outcome_check",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}: {self.outcome} at {self.finished_at}"
