"""Who works a desk item, by when, and who is told (docs/routing.md).

An *item* is anything a person must act on, named by ``(item_kind, item_id)``: a
takeover escalation (``desk.escalation``) or an approval (``approval``). Routing
never imports the item's app; the kind says whose id it is.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from portal.ids import new_id


class ItemKind(models.TextChoices):
    ESCALATION = "desk.escalation"
    APPROVAL = "approval"
    # Append only: the kind is stored in assignments and notifications' facts.


class Channel(models.TextChoices):
    EMAIL = "email"
    WEBHOOK = "webhook"


class NotificationState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    DEAD = "dead"


class Group(models.Model):
    """A team that desk items go to, e.g. "Billing support"."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    name = models.CharField(max_length=100)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="routing_group_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "name"], name="routing_group_name_uniq"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class GroupMember(models.Model):
    """A person in a group, and whether they want its items by e-mail."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    group = models.ForeignKey(
        Group, on_delete=models.CASCADE, db_constraint=False, related_name="members"
    )
    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="+")
    # The person's choice per channel; webhooks go to the group's channel, not to
    # a person, so e-mail is the only personal one.
    email_enabled = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="routing_groupmember_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "group", "user"], name="routing_groupmember_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.group}"


class RoutingRule(models.Model):
    """Where a reason code's items go and how long they may wait.

    ``reason_code`` empty is the tenant's default rule.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    reason_code = models.CharField(max_length=40, blank=True, default="")
    group = models.ForeignKey(
        Group, on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    backup_group = models.ForeignKey(
        Group,
        on_delete=models.PROTECT,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    remind_after_s = models.PositiveIntegerField(default=900)
    escalate_after_s = models.PositiveIntegerField(default=3600)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="routing_routingrule_tenant_id_uniq"
            ),
            # One rule per reason code (and one default) per tenant.
            models.UniqueConstraint(
                fields=["tenant", "reason_code"], name="routing_routingrule_reason_uniq"
            ),
            models.CheckConstraint(
                condition=Q(remind_after_s__gt=0)
                & Q(escalate_after_s__gt=models.F("remind_after_s")),
                name="routing_routingrule_intervals_check",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reason_code or '(default)'} -> {self.group_id}"


class Webhook(models.Model):
    """A Slack-compatible endpoint that hears about every desk item of the tenant.

    Its HMAC secret is derived from the server secret (``routing.webhooks``), never
    stored.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    url = models.CharField(max_length=500)
    enabled = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="routing_webhook_tenant_id_uniq"
            ),
        ]

    def __str__(self) -> str:
        return self.url


class Assignment(models.Model):
    """One item's current group (and person), and its SLA clock."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    item_kind = models.CharField(max_length=40, choices=ItemKind)
    item_id = models.UUIDField()
    # The item's task, when it has one: the desk's link and the events' chain.
    task_id = models.UUIDField(null=True, blank=True)
    reason_code = models.CharField(max_length=40, blank=True, default="")
    group = models.ForeignKey(
        Group, on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    person = models.ForeignKey(
        "auth.User", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    assigned_at = models.DateTimeField()
    remind_at = models.DateTimeField()
    escalate_at = models.DateTimeField()
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="routing_assignment_tenant_id_uniq"
            ),
            # One assignment per item: reassigning moves it, never adds one.
            models.UniqueConstraint(
                fields=["tenant", "item_kind", "item_id"],
                name="routing_assignment_item_uniq",
            ),
            models.CheckConstraint(
                condition=Q(item_kind__in=ItemKind.values),
                name="routing_assignment_item_kind_check",
            ),
        ]
        indexes = [
            # The SLA sweep: open items by their next deadline.
            models.Index(
                fields=["remind_at"],
                condition=Q(closed_at__isnull=True),
                name="routing_assignment_open_idx",
            ),
            # The dashboard's overdue count per tenant: a capped range of it.
            models.Index(
                fields=["tenant", "escalate_at"],
                condition=Q(closed_at__isnull=True),
                name="routing_assignment_due_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.item_kind} {self.item_id}"


class Notification(models.Model):
    """One message to one recipient on one channel, for one event: the
    notifications' own outbox, written in the event's transaction.

    ``(tenant, event_id, channel, recipient)`` is unique, so the same event never
    makes a second message for a recipient, however often it is written.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    event_id = models.UUIDField()
    channel = models.CharField(max_length=10, choices=Channel)
    # A user id (e-mail) or a webhook id; the address itself is read when sending.
    recipient = models.CharField(max_length=100)
    # What the message says: codes and ids only (routing.notify.facts).
    facts = models.JSONField()
    state = models.CharField(
        max_length=10, choices=NotificationState, default=NotificationState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    available_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="routing_notification_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "event_id", "channel", "recipient"],
                name="routing_notification_once_uniq",
            ),
            models.CheckConstraint(
                condition=Q(channel__in=Channel.values),
                name="routing_notification_channel_check",
            ),
            models.CheckConstraint(
                condition=Q(state__in=NotificationState.values),
                name="routing_notification_state_check",
            ),
        ]
        indexes = [
            models.Index(
                fields=["available_at"],
                condition=Q(state="pending"),
                name="routing_notification_due_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.recipient} ({self.state})"
