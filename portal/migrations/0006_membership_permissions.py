"""Give every existing membership the object permissions its role carries.

From 0005 on, ``services.membership_write`` keeps the permissions in step with the
role; memberships made before need them once. The role table is copied here (no app
imports in migrations, docs/style.md R7); ``tests/unit/portal/test_roles.py`` checks the
copy equals ``portal.roles.ROLE_PERMISSIONS``.
"""

from __future__ import annotations

from django.contrib.auth.management import create_permissions
from django.db import migrations

ROLE_PERMISSIONS = {
    "reviewer": ["view_trail", "export_trail"],
    "support": ["view_trail", "work_takeover"],
    "admin": [
        "view_trail",
        "export_trail",
        "work_takeover",
        "release_any_claim",
        "manage_tenant",
        "manage_outbox",
    ],
}


def grant(apps, schema_editor):
    # The permission rows are normally made after migrate; make them now.
    # (create_permissions skips an app config without a models module, which the
    # historical ones lack.)
    config = apps.get_app_config("portal")
    config.models_module = True
    create_permissions(config, verbosity=0, apps=apps)
    config.models_module = None
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Membership = apps.get_model("portal", "Membership")
    UserObjectPermission = apps.get_model("guardian", "UserObjectPermission")
    tenant_type, _ = ContentType.objects.get_or_create(
        app_label="portal", model="tenant"
    )
    for membership in Membership.objects.all():
        for codename in ROLE_PERMISSIONS[membership.role]:
            UserObjectPermission.objects.get_or_create(
                user_id=membership.user_id,
                content_type=tenant_type,
                object_pk=str(membership.tenant_id),
                permission=Permission.objects.get(
                    content_type=tenant_type, codename=codename
                ),
            )


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0005_tenant_permissions"),
        (
            "guardian",
            "0003_remove_groupobjectpermission_guardian_gr_content_ae6aec_idx_and_more",
        ),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
