"""What each membership role may do in its tenant, as object permissions on the tenant.

A membership's role is stored on ``Membership``; the permissions it carries are
django-guardian object permissions on the ``Tenant`` row, written by
``services.membership_grant`` / ``membership_revoke`` in the same transaction as the
membership. Every check then reads ``user.has_perm(perm, tenant)`` or, for a list
of rows, :func:`tenant_ids_with_perm`. A superuser is the platform operator and
holds every permission on every tenant.
"""

from __future__ import annotations

import uuid
from typing import Final

from django.contrib.auth.models import AnonymousUser, Permission, User
from django.contrib.contenttypes.models import ContentType
from guardian.models import UserObjectPermission

from .exceptions import PermissionDenied, TenantNotVisible
from .models import Role, Tenant, TenantPerm

# The admin's request.user; django.contrib.auth's User is this project's user model.
Person = User | AnonymousUser


_P = TenantPerm
ROLE_PERMISSIONS: Final[dict[str, frozenset[str]]] = {
    # Read-only: the whole trail and the takeover desk, plus export.
    Role.REVIEWER: frozenset({_P.VIEW_TRAIL, _P.EXPORT_TRAIL}),
    # The takeover desk; reads tasks and events.
    Role.SUPPORT: frozenset({_P.VIEW_TRAIL, _P.WORK_TAKEOVER}),
    Role.ADMIN: frozenset(TenantPerm.values),
}


def qualified(perm: str) -> str:
    """``view_trail`` → ``portal.view_trail`` (what ``has_perm`` takes)."""
    return f"portal.{perm}"


def tenant_ids_with_perm(
    *, user: Person, perm: str, cache: dict[str, list[uuid.UUID]] | None = None
) -> list[uuid.UUID]:
    """Ids of live tenants on which the user holds ``perm`` (all for a superuser).

    Two statements (the object permissions, then the live tenants among them);
    ``cache`` (e.g. a dict kept on the request) spares repeats.
    """
    if cache is not None and perm in cache:
        return cache[perm]
    if not user.is_authenticated or not user.is_active:
        ids: list[uuid.UUID] = []
    else:
        live = Tenant.objects.filter(deleted_at__isnull=True)
        if not user.is_superuser:
            granted = UserObjectPermission.objects.filter(
                user_id=user.pk,
                content_type=ContentType.objects.get_for_model(Tenant),
                permission__codename=perm,
            ).values_list("object_pk", flat=True)
            live = live.filter(pk__in=[uuid.UUID(pk) for pk in granted])
        ids = list(live.order_by("slug").values_list("pk", flat=True))
    if cache is not None:
        cache[perm] = ids
    return ids


def has_tenant_perm(*, user: Person, perm: str, tenant: Tenant) -> bool:
    """Whether the user holds ``perm`` on this live tenant."""
    if tenant.deleted_at is not None or not user.is_active:
        return False
    return user.has_perm(qualified(perm), tenant)


def require_tenant_perm(*, user: Person, perm: str, tenant: Tenant) -> None:
    """Refuse unless the user holds ``perm`` on the tenant.

    Raises:
        TenantNotVisible: the user cannot even read the tenant (it does not exist
            for them, as for the API's another-tenant rule).
        PermissionDenied: the user reads the tenant but their role lacks ``perm``.
    """
    if has_tenant_perm(user=user, perm=perm, tenant=tenant):
        return
    if has_tenant_perm(user=user, perm=TenantPerm.VIEW_TRAIL, tenant=tenant):
        raise PermissionDenied(perm=perm, tenant=tenant.slug)
    raise TenantNotVisible()


def role_permissions_set(*, user_id: int, tenant: Tenant, role: str | None) -> None:
    """Make the user's object permissions on the tenant exactly those of ``role``.

    ``None`` removes them all. Called inside the membership service's transaction.
    """
    content_type = ContentType.objects.get_for_model(Tenant)
    UserObjectPermission.objects.filter(
        user_id=user_id,
        content_type=content_type,
        object_pk=str(tenant.pk),
        permission__codename__in=TenantPerm.values,
    ).delete()
    if role is None:
        return
    permissions = Permission.objects.filter(
        content_type=content_type, codename__in=ROLE_PERMISSIONS[role]
    )
    UserObjectPermission.objects.bulk_create(
        UserObjectPermission(
            user_id=user_id,
            content_type=content_type,
            object_pk=str(tenant.pk),
            permission=permission,
        )
        for permission in permissions
    )


def perms_of(*, user: Person, tenant: Tenant) -> set[str]:
    """The tenant permissions the user holds (for display and tests)."""
    return {
        perm
        for perm in TenantPerm.values
        if has_tenant_perm(user=user, perm=perm, tenant=tenant)
    }
