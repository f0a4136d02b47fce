"""The tenant-scoped ModelAdmin every page of the portal is built on.

Each admin names the tenant permission that lets a person read its rows
(``view_perm``) and, if people may change them, the one that lets them change
(``manage_perm``). The base then keeps every view to the tenants where the person
holds that permission: the changelist and change pages, foreign-key and
autocomplete choices, the tenant list filter, history, and actions. The trail's
wide lists (``tenant_column_if_several``) show their tenant column only to a person
who reads more than one tenant. Nothing is
deleted through the admin; changes go through services that check the role again
and write an event (docs/style.md R13). ``tests/browser`` and ``tests/console``
walk the admin registry so a new ModelAdmin cannot skip this base.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.text import capfirst

from portal.exceptions import PortalError
from portal.models import Tenant, TenantPerm
from portal.roles import tenant_ids_with_perm


def tenant_ids(request: HttpRequest, perm: str) -> list[uuid.UUID]:
    """Ids of the live tenants where the request's user holds ``perm`` (cached)."""
    cache = request.__dict__.setdefault("_portal_tenant_perms", {})
    return tenant_ids_with_perm(user=request.user, perm=perm, cache=cache)


class TenantListFilter(admin.SimpleListFilter):
    """Filter by tenant, offering only the tenants the person may read."""

    title = "tenant"
    parameter_name = "tenant"
    perm: ClassVar[str] = TenantPerm.VIEW_TRAIL
    field: ClassVar[str] = "tenant_id"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        perm = getattr(model_admin, "view_perm", self.perm)
        ids = tenant_ids(request, perm)
        return [
            (str(pk), slug)
            for pk, slug in Tenant.objects.filter(pk__in=ids)
            .order_by("slug")
            .values_list("pk", "slug")
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        try:
            return queryset.filter(**{self.field: uuid.UUID(value)})
        except ValueError:
            return queryset.none()


class TenantScopedAdmin(admin.ModelAdmin):
    """Rows of the person's tenants only; read-only unless ``manage_perm`` is set."""

    # The path to the row's tenant ("" when the model is Tenant itself).
    tenant_field: ClassVar[str] = "tenant"
    view_perm: ClassVar[str] = TenantPerm.VIEW_TRAIL
    manage_perm: ClassVar[str | None] = None
    # Whether people with ``manage_perm`` may add rows (through ``save_model``).
    allow_add: ClassVar[bool] = False
    show_full_result_count = False
    # Ids are UUIDv7, so this is newest first; autocomplete needs an order too.
    ordering = ["-pk"]
    # The list page's title (heading and browser tab); None: the plural name.
    # Django's own reads "Select takeover desk item to view".
    list_title: ClassVar[str | None] = None
    # Whether the list drops its "tenant" column for a person of one tenant, where
    # it says nothing (the wide lists, to fit 1,400 px).
    tenant_column_if_several: ClassVar[bool] = False

    # --- titles -------------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        title = self.list_title or capfirst(str(self.model._meta.verbose_name_plural))
        return super().changelist_view(
            request, {"title": title, **(extra_context or {})}
        )

    # --- whose rows -------------------------------------------------------------

    def _tenant_lookup(self) -> str:
        return f"{self.tenant_field}_id__in" if self.tenant_field else "pk__in"

    def tenant_id_of(self, obj: Model) -> uuid.UUID:
        if not self.tenant_field:
            return obj.pk
        return getattr(obj, f"{self.tenant_field}_id")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        ids = tenant_ids(request, self.view_perm)
        return super().get_queryset(request).filter(**{self._tenant_lookup(): ids})

    def manageable(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> QuerySet[Any]:
        """The part of ``queryset`` the person may change (used by actions)."""
        if self.manage_perm is None:
            return queryset.none()
        ids = tenant_ids(request, self.manage_perm)
        return queryset.filter(**{self._tenant_lookup(): ids})

    # --- what the person may do -----------------------------------------------

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_view_permission(
        self, request: HttpRequest, obj: Model | None = None
    ) -> bool:
        ids = tenant_ids(request, self.view_perm)
        return bool(ids) if obj is None else self.tenant_id_of(obj) in ids

    def has_manage_permission(
        self, request: HttpRequest, obj: Model | None = None
    ) -> bool:
        if self.manage_perm is None:
            return False
        ids = tenant_ids(request, self.manage_perm)
        return bool(ids) if obj is None else self.tenant_id_of(obj) in ids

    def has_change_permission(
        self, request: HttpRequest, obj: Model | None = None
    ) -> bool:
        return self.has_manage_permission(request, obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.allow_add and self.has_manage_permission(request)

    def has_delete_permission(
        self, request: HttpRequest, obj: Model | None = None
    ) -> bool:
        return False  # rows are removed by service-backed actions, each audited

    # --- choices ------------------------------------------------------------------

    def formfield_for_foreignkey(
        self, db_field: Any, request: HttpRequest, **kwargs: Any
    ) -> Any:
        perm = self.manage_perm or self.view_perm
        related = db_field.related_model
        if related is Tenant:
            kwargs["queryset"] = Tenant.objects.filter(
                pk__in=tenant_ids(request, perm)
            ).order_by("slug")
        elif any(f.name == "tenant" for f in related._meta.concrete_fields):
            kwargs["queryset"] = related._default_manager.filter(
                tenant_id__in=tenant_ids(request, perm)
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = list(super().get_list_display(request))
        if (
            self.tenant_column_if_several
            and "tenant" in columns
            and len(tenant_ids(request, self.view_perm)) == 1
        ):
            columns.remove("tenant")
        return columns

    def get_list_filter(self, request: HttpRequest) -> Any:
        return [
            TenantListFilter if name == "tenant" else name
            for name in super().get_list_filter(request)
        ]

    # --- saving through services -------------------------------------------------

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # Services open their own durable transaction (docs/style.md R5), which the
        # admin's atomic wrapper around the save would nest: take the view without
        # it. A refusal from a service (role, validation, race) is shown, not a 500.
        if object_id is not None:
            # The row's kind as the title, its name as the subtitle (the admin's
            # "View task" / "Change agent" says what the buttons already say).
            extra_context = {
                "title": capfirst(str(self.model._meta.verbose_name)),
                **(extra_context or {}),
            }
        try:
            return self._changeform_view(  # type: ignore[attr-defined]
                request, object_id, form_url, extra_context
            )
        except PortalError as error:
            self.message_user(request, error.detail, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    @staticmethod
    def adopt(obj: Model, saved: Model) -> None:
        """Make the admin's unsaved ``obj`` the row a service saved (for its log
        entry and redirect)."""
        for field in saved._meta.concrete_fields:
            setattr(obj, field.attname, getattr(saved, field.attname))

    def row_name(self, row: Model) -> str:
        """How an action's message names a row; its ``str`` unless an admin says."""
        return str(row)

    def run_service(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        change: Any,
        done: str,
    ) -> None:
        """Apply ``change(row)`` to each row the person may manage; report each,
        by ``row_name`` (the message keeps the name's case: admin/base_site.html)."""
        allowed = self.manageable(request, queryset)
        skipped = queryset.count() - allowed.count()
        for row in allowed.order_by("pk"):
            name = self.row_name(row)
            try:
                change(row)
            except PortalError as error:
                self.message_user(request, f"{name}: {error.detail}", messages.ERROR)
            else:
                self.message_user(request, f"{name}: {done}.")
        if skipped:
            self.message_user(
                request,
                f"{skipped} selected row(s) skipped: your role there does not allow "
                "it.",
                messages.WARNING,
            )
