"""Approvals are routed like desk items (docs/routing.md): the item kind
``approval`` is allowed, and the sweep also visits tenants with an open approval
past its window, so the sweep's job records it expired (docs/approvals.md).

The discovery function reads ``tasks_approval`` by name (tenant, state and window
only), as the sweep reads ``tasks_escalation``; routing imports nothing of tasks.
Its ``search_path`` keeps ``pg_temp`` last (tenant_deletion migration 0001: a
caller's temporary table must not shadow a real one in a definer function).
"""

from __future__ import annotations

from django.db import migrations, models

DISCOVERY_ROLE = "portal_discovery"

BODY = """
    SELECT a.tenant_id FROM routing_assignment a
    WHERE a.closed_at IS NULL AND (
        (a.reminded_at IS NULL AND a.remind_at <= app_now())
        OR (a.escalated_at IS NULL AND a.escalate_at <= app_now())
        OR a.escalated_at IS NOT NULL)
    UNION
    SELECT n.tenant_id FROM routing_notification n
    WHERE n.state = 'pending' AND n.available_at <= app_now()
    UNION
    SELECT p.tenant_id FROM tasks_approval p
    WHERE p.state IN ('waiting', 'approved') AND p.expires_at <= app_now()
"""

OLD_BODY = """
    SELECT a.tenant_id FROM routing_assignment a
    WHERE a.closed_at IS NULL AND (
        (a.reminded_at IS NULL AND a.remind_at <= app_now())
        OR (a.escalated_at IS NULL AND a.escalate_at <= app_now())
        OR a.escalated_at IS NOT NULL)
    UNION
    SELECT n.tenant_id FROM routing_notification n
    WHERE n.state = 'pending' AND n.available_at <= app_now()
"""

REPLACE = """
CREATE OR REPLACE FUNCTION routing_tenants_with_due_work() RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp AS $$
{body}
$$;
"""

GRANT = f"""
GRANT SELECT (tenant_id, state, expires_at) ON tasks_approval TO {DISCOVERY_ROLE};
"""
REVOKE = f"""
REVOKE SELECT (tenant_id, state, expires_at) ON tasks_approval FROM {DISCOVERY_ROLE};
"""


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0004_discover_escalated_open_items"),
        ("tasks", "0021_approval_quorum"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="assignment",
            name="routing_assignment_item_kind_check",
        ),
        migrations.AlterField(
            model_name="assignment",
            name="item_kind",
            field=models.CharField(
                choices=[("desk.escalation", "Escalation"), ("approval", "Approval")],
                max_length=40,
            ),
        ),
        migrations.AddConstraint(
            model_name="assignment",
            constraint=models.CheckConstraint(
                condition=models.Q(("item_kind__in", ["desk.escalation", "approval"])),
                name="routing_assignment_item_kind_check",
            ),
        ),
        migrations.RunSQL(
            GRANT + REPLACE.format(body=BODY), REPLACE.format(body=OLD_BODY) + REVOKE
        ),
    ]
