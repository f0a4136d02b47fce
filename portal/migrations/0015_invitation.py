"""Invitations (console/invitations.py): the table, row-level security with the
scope policy (tasks/0017), and the discovery function the link's page asks which
tenant holds the invitation whose token hashes to a value: before the person has a
tenant, as ``portal_agent_key_tenant`` does for a key (docs/database-roles.md,
"Work across tenants")."""

from __future__ import annotations

import django.db.models.deletion
import django.db.models.functions.datetime
import django.db.models.functions.text
from django.conf import settings
from django.db import migrations, models

import portal.ids

DISCOVERY_ROLE = "portal_discovery"

POLICY = """
ALTER TABLE portal_invitation ENABLE ROW LEVEL SECURITY;
ALTER TABLE portal_invitation FORCE ROW LEVEL SECURITY;
CREATE POLICY portal_invitation_tenant_scope ON portal_invitation
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
"""

NO_POLICY = """
DROP POLICY portal_invitation_tenant_scope ON portal_invitation;
ALTER TABLE portal_invitation NO FORCE ROW LEVEL SECURITY;
ALTER TABLE portal_invitation DISABLE ROW LEVEL SECURITY;
"""

# The tenant of the invitation whose token hashes to p_token_hash: only the holder
# of the link learns it. Used, expired and open alike, so that the page can say
# which (the row itself is then read in that tenant's scope).
DISCOVERY = f"""
GRANT CREATE ON SCHEMA public TO {DISCOVERY_ROLE};
GRANT SELECT (tenant_id, token_hash) ON portal_invitation TO {DISCOVERY_ROLE};
CREATE FUNCTION portal_invitation_tenant(p_token_hash text) RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT i.tenant_id FROM portal_invitation i WHERE i.token_hash = p_token_hash
$$;
REVOKE ALL ON FUNCTION portal_invitation_tenant(text) FROM PUBLIC;
ALTER FUNCTION portal_invitation_tenant(text) OWNER TO {DISCOVERY_ROLE};
REVOKE CREATE ON SCHEMA public FROM {DISCOVERY_ROLE};
"""

NO_DISCOVERY = f"""
DROP FUNCTION portal_invitation_tenant(text);
REVOKE SELECT (tenant_id, token_hash) ON portal_invitation FROM {DISCOVERY_ROLE};
"""


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0014_reason_code_domain"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Invitation",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=portal.ids.new_id,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("email", models.EmailField(max_length=254)),
                (
                    "role",
                    models.CharField(
                        choices=[
                            ("reviewer", "Compliance reviewer"),
                            ("support", "Support staff"),
                            ("admin", "Tenant administrator"),
                        ],
                        max_length=20,
                    ),
                ),
                (
                    "token_hash",
                    models.CharField(editable=False, max_length=64, unique=True),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        editable=False,
                    ),
                ),
                ("expires_at", models.DateTimeField()),
                (
                    "accepted_at",
                    models.DateTimeField(blank=True, editable=False, null=True),
                ),
                (
                    "accepted_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "invited_by",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="invitations",
                        to="portal.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "id"), name="portal_invitation_tenant_id_uniq"
                    ),
                    models.UniqueConstraint(
                        condition=models.Q(("accepted_at__isnull", True)),
                        fields=("tenant", "email"),
                        name="portal_invitation_open_uniq",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("role__in", ["reviewer", "support", "admin"])
                        ),
                        name="portal_invitation_role_check",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("email", django.db.models.functions.text.Lower("email"))
                        ),
                        name="portal_invitation_email_lower_check",
                    ),
                ],
            },
        ),
        migrations.RunSQL(POLICY, NO_POLICY),
        migrations.RunSQL(DISCOVERY, NO_DISCOVERY),
    ]
