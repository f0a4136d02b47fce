"""Every admin page is tenant-scoped and declares who may see and change it.

Walks the admin registry, as tests/db/test_composite_fks.py walks the models: a new
ModelAdmin fails here until it is built on TenantScopedAdmin and its actions name
the permission they need.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.db.models import ForeignKey

from console.admin.base import TenantScopedAdmin
from portal.models import Tenant, TenantPerm

# Django's own account pages: only a superuser (the platform operator) opens them,
# through Django's model permissions, which no membership grants.
PLATFORM_ONLY = {User, Group}

# Who reads each page, and who changes it: the roles policy of issue 8, written out
# so a change to a page's permissions is a visible change to this table.
V, M, OUT = TenantPerm.VIEW_TRAIL, TenantPerm.MANAGE_TENANT, TenantPerm.MANAGE_OUTBOX
POLICY = {
    "portal.tenant": (V, M),
    "portal.agent": (V, M),
    "portal.agentkey": (M, M),
    "portal.agentgrant": (V, M),
    "portal.membership": (M, M),
    "portal.invitation": (M, M),
    "tasks.task": (V, None),
    "tasks.operation": (V, None),
    "tasks.contract": (V, M),
    "tasks.credential": (V, None),
    "tasks.objectversion": (V, None),
    "tasks.connector": (M, M),
    "tasks.escalation": (V, None),
    "tasks.approval": (V, None),
    "audit.event": (V, None),
    "audit.outbox": (OUT, OUT),  # retry/dismiss dead rows (audited actions)
    "audit.retentionpolicy": (V, M),
    "console.takeoveritem": (V, TenantPerm.WORK_TAKEOVER),
    # Reviewers read the agents' limits and budgets; support does not (limits/).
    "limits.ratelimit": (TenantPerm.EXPORT_TRAIL, M),
    "limits.budget": (TenantPerm.EXPORT_TRAIL, M),
    # Reviewers read the policies in force and their drafts; support does not.
    "policies.policyset": (TenantPerm.EXPORT_TRAIL, M),
    # Desk routing (docs/routing.md): reviewers read who gets what; a webhook's
    # page shows its signing secret, so only administrators open it.
    "routing.group": (V, M),
    "routing.groupmember": (V, M),
    "routing.routingrule": (V, M),
    "routing.webhook": (M, M),
}


def scoped_admins() -> list[tuple[type, admin.ModelAdmin]]:
    return [
        (model, model_admin)
        for model, model_admin in admin.site._registry.items()
        if model not in PLATFORM_ONLY
    ]


def test_every_admin_page_is_built_on_the_tenant_scoped_base():
    offenders = [
        model._meta.label
        for model, model_admin in scoped_admins()
        if not isinstance(model_admin, TenantScopedAdmin)
    ]
    assert offenders == []


def test_every_admin_names_a_real_path_to_its_tenant():
    for model, model_admin in scoped_admins():
        assert isinstance(model_admin, TenantScopedAdmin)
        if not model_admin.tenant_field:
            assert model is Tenant
            continue
        tenant_fk = model._meta.get_field(model_admin.tenant_field)
        assert isinstance(tenant_fk, ForeignKey)
        assert tenant_fk.related_model is Tenant, model._meta.label


def test_every_action_declares_the_permission_it_needs():
    for model, model_admin in scoped_admins():
        for name in model_admin.actions or []:
            action = getattr(model_admin, name) if isinstance(name, str) else name
            needed = getattr(action, "allowed_permissions", ())
            assert needed, f"{model._meta.label}: action {name} names no permission"
            for permission in needed:
                assert hasattr(model_admin, f"has_{permission}_permission")


def test_no_list_column_is_a_model_field_hidden_behind_an_admin_method():
    # Django shows a list column named like a model field as that field, whatever
    # method of that name the admin has: a foreign key then costs one query per row
    # (the operation list's "task" did, 100 queries a page).
    offenders = [
        f"{model._meta.label}.{name}"
        for model, model_admin in scoped_admins()
        for name in model_admin.list_display
        if isinstance(name, str)
        and callable(getattr(model_admin, name, None))
        and name
        in {f.name for f in (*model._meta.concrete_fields, *model._meta.many_to_many)}
    ]
    assert offenders == []


def test_each_page_reads_and_changes_with_the_permissions_of_the_policy():
    pages = {
        model._meta.label_lower: (model_admin.view_perm, model_admin.manage_perm)
        for model, model_admin in scoped_admins()
        if isinstance(model_admin, TenantScopedAdmin)
    }
    assert pages == POLICY
