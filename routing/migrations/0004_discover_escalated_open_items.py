"""The sweep also visits tenants with escalated items still open, so an item whose
escalation a person resolved after the deadline is closed (and leaves the
dashboard's "Past SLA" count); before, nothing was due there any more.
"""

from __future__ import annotations

from django.db import migrations

BODY = """
    SELECT a.tenant_id FROM routing_assignment a
    WHERE a.closed_at IS NULL AND (
        (a.reminded_at IS NULL AND a.remind_at <= app_now())
        OR (a.escalated_at IS NULL AND a.escalate_at <= app_now())
        OR a.escalated_at IS NOT NULL)
    UNION
    SELECT n.tenant_id FROM routing_notification n
    WHERE n.state = 'pending' AND n.available_at <= app_now()
"""

OLD_BODY = """
    SELECT a.tenant_id FROM routing_assignment a
    WHERE a.closed_at IS NULL AND (
        (a.reminded_at IS NULL AND a.remind_at <= app_now())
        OR (a.escalated_at IS NULL AND a.escalate_at <= app_now()))
    UNION
    SELECT n.tenant_id FROM routing_notification n
    WHERE n.state = 'pending' AND n.available_at <= app_now()
"""

REPLACE = """
CREATE OR REPLACE FUNCTION routing_tenants_with_due_work() RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
{body}
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("routing", "0003_assignment_due_index")]

    operations = [
        migrations.RunSQL(REPLACE.format(body=BODY), REPLACE.format(body=OLD_BODY)),
    ]
