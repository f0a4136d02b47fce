"""A tenant's Cedar policy set, versioned like contracts (docs/policies.md)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from portal.ids import new_id


class PolicySetState(models.TextChoices):
    DRAFT = "draft"
    PUBLISHED = "published"  # in force; at most one per tenant
    RETIRED = "retired"


class PolicySet(models.Model):
    """One version of a tenant's policies, as Cedar text.

    A draft may be edited; publishing retires the version in force and freezes this
    one (a trigger refuses any change but ``published -> retired``, migration 0002).
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tenant = models.ForeignKey("portal.Tenant", on_delete=models.PROTECT)
    version = models.PositiveIntegerField()
    state = models.CharField(
        max_length=10, choices=PolicySetState, default=PolicySetState.DRAFT
    )
    text = models.TextField()
    note = models.CharField(max_length=500, blank=True, default="")
    created_by = models.ForeignKey(
        "auth.User", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    published_by = models.ForeignKey(
        "auth.User", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())
    published_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="policies_policyset_tenant_id_uniq"
            ),
            models.UniqueConstraint(
                fields=["tenant", "version"], name="policies_policyset_version_uniq"
            ),
            # The gateway evaluates the one version in force: never two.
            models.UniqueConstraint(
                fields=["tenant"],
                condition=Q(state=PolicySetState.PUBLISHED),
                name="policies_policyset_one_published_uniq",
            ),
            models.CheckConstraint(
                condition=Q(state__in=PolicySetState.values),
                name="policies_policyset_state_check",
            ),
            models.CheckConstraint(
                condition=Q(state=PolicySetState.DRAFT) | Q(published_at__isnull=False),
                name="policies_policyset_published_at_check",
            ),
        ]

    def __str__(self) -> str:
        return f"policies v{self.version} ({self.state})"
