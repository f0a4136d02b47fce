"""Per-agent rate limits and amount budgets, and their counters (docs/limits.md).

A limit names an agent, an action and a target (``*``: any target). Its counter is
one row per (limit, window), moved by one ``INSERT … ON CONFLICT DO UPDATE … WHERE``
statement in the reservation's transaction, so no number of processes can take
more than the limit allows: PostgreSQL is the one counter every process shares.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from portal.ids import new_id


class RateLimit(models.Model):
    """At most ``max_calls`` reservations of an action on a target per window."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    agent = models.ForeignKey(
        "portal.Agent", on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    action = models.CharField(max_length=100)
    target = models.CharField(max_length=200, default="*")
    max_calls = models.PositiveIntegerField()
    window_s = models.PositiveIntegerField(default=60)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="limits_ratelimit_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "agent", "action", "target"],
                name="limits_ratelimit_uniq",
            ),
            models.CheckConstraint(
                condition=Q(max_calls__gte=1) & Q(window_s__gte=1),
                name="limits_ratelimit_positive_check",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} on {self.target}: {self.max_calls} per {self.window_s}s"


class Budget(models.Model):
    """At most ``max_total`` of one input member's amounts per window (a day).

    ``argument`` names the member of the operation's input that holds the amount
    (e.g. ``amount`` of a refund); a reservation whose input lacks it, or holds no
    non-negative number there, is refused.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    agent = models.ForeignKey(
        "portal.Agent", on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    action = models.CharField(max_length=100)
    target = models.CharField(max_length=200, default="*")
    argument = models.CharField(max_length=100)
    max_total = models.DecimalField(max_digits=20, decimal_places=4)
    window_s = models.PositiveIntegerField(default=86400)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="limits_budget_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "agent", "action", "target", "argument"],
                name="limits_budget_uniq",
            ),
            models.CheckConstraint(
                condition=Q(max_total__gte=0) & Q(window_s__gte=1),
                name="limits_budget_positive_check",
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.action} on {self.target}: {self.argument} ≤ {self.max_total} "
            f"per {self.window_s}s"
        )


class LimitUsage(models.Model):
    """What one limit or budget has used in one window.

    Exactly one of ``rate_limit``/``budget`` is set. ``used`` counts calls (a rate
    limit) or sums amounts (a budget); the database refuses a row above its
    ``allowed`` (copied from the limit when the window's row is made), so even a
    statement that forgot the guard could not overspend.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    rate_limit = models.ForeignKey(
        RateLimit, null=True, on_delete=models.CASCADE, db_constraint=False
    )
    budget = models.ForeignKey(
        Budget, null=True, on_delete=models.CASCADE, db_constraint=False
    )
    window_start = models.DateTimeField()
    used = models.DecimalField(max_digits=20, decimal_places=4)
    allowed = models.DecimalField(max_digits=20, decimal_places=4)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="limits_limitusage_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "rate_limit", "window_start"],
                condition=Q(rate_limit__isnull=False),
                name="limits_limitusage_rate_window_uniq",
            ),
            models.UniqueConstraint(
                fields=["tenant", "budget", "window_start"],
                condition=Q(budget__isnull=False),
                name="limits_limitusage_budget_window_uniq",
            ),
            models.CheckConstraint(
                condition=(Q(rate_limit__isnull=False) & Q(budget__isnull=True))
                | (Q(rate_limit__isnull=True) & Q(budget__isnull=False)),
                name="limits_limitusage_one_limit_check",
            ),
            # The last wall: no statement can store more than the window allows.
            models.CheckConstraint(
                condition=Q(used__gte=0) & Q(used__lte=F("allowed")),
                name="limits_limitusage_within_check",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.used} of {self.allowed} since {self.window_start}"
