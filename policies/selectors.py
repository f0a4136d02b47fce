"""Reads of a tenant's policy sets; each takes the tenant first (docs/style.md R3)."""

from __future__ import annotations

from django.db.models import QuerySet

from portal.models import Tenant

from .exceptions import PolicySetNotFound
from .models import PolicySet, PolicySetState


def policy_set_in_force(*, tenant: Tenant) -> PolicySet | None:
    """The tenant's published version, or None: then grants alone decide."""
    return PolicySet.objects.filter(
        tenant=tenant, state=PolicySetState.PUBLISHED
    ).first()


def policy_set_get(*, tenant: Tenant, version: int) -> PolicySet:
    """One version of the tenant's policy set.

    Raises:
        PolicySetNotFound: no such version in the tenant.
    """
    try:
        return PolicySet.objects.get(tenant=tenant, version=version)
    except PolicySet.DoesNotExist:
        raise PolicySetNotFound(version=version) from None


def policy_set_list(*, tenant: Tenant) -> QuerySet[PolicySet]:
    """The tenant's versions, newest first."""
    return PolicySet.objects.filter(tenant=tenant).order_by("-version")
