"""One statement authenticates an agent key and counts the request in its window.

``portal_agent_key_authenticate(prefix, key_hash, window_s)`` does in one round trip
what an API request did in seven (docs/performance-log.md, "Issue 23: the key, the
scope and the rate window in one round trip"): it asks the discovery function
``portal_agent_key_tenant`` which tenant the key belongs to (the one way across
tenants, docs/database-roles.md), sets that tenant's scope, reads the key, its agent
and tenant under row-level security, and, when ``window_s`` is given and the key
authenticates (live, agent active and not frozen, tenant neither deleted nor
frozen), counts the request in the agent's fixed window on the database clock
(``portal_agentrequestwindow``). It then puts the scope back as it found it.

``SECURITY INVOKER`` on purpose: it runs as the app role, under the same policies
as every other statement; only the discovery function crosses tenants, and it
returns tenant ids alone. The counting statement is the one ``AgentRateThrottle``
ran itself until now, unchanged.
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE FUNCTION portal_agent_key_authenticate(
    p_prefix text, p_key_hash text, p_window_s integer
) RETURNS TABLE (
    o_key portal_agentkey, o_agent portal_agent, o_tenant portal_tenant,
    o_expired boolean, o_requests integer, o_left_s double precision
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_scope text := current_setting('portal.tenant_ids', true);
    v_tenants text;
    v_row record;
    v_found boolean;
BEGIN
    SELECT string_agg(d::text, ',') INTO v_tenants
    FROM portal_agent_key_tenant(p_prefix, p_key_hash) AS d;
    IF v_tenants IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('portal.tenant_ids', v_tenants, true);
    SELECT k AS key_row, a AS agent_row, t AS tenant_row,
           k.expires_at IS NOT NULL AND k.expires_at <= app_now() AS expired
    INTO v_row
    FROM portal_agentkey k
    JOIN portal_agent a ON a.id = k.agent_id AND a.tenant_id = k.tenant_id
    JOIN portal_tenant t ON t.id = a.tenant_id
    WHERE k.prefix = p_prefix AND k.key_hash = p_key_hash;
    v_found := FOUND;
    IF v_found THEN
        o_key := v_row.key_row;
        o_agent := v_row.agent_row;
        o_tenant := v_row.tenant_row;
        o_expired := v_row.expired;
    END IF;
    IF v_found AND p_window_s IS NOT NULL AND (o_key).revoked_at IS NULL
       AND NOT o_expired AND (o_agent).is_active AND (o_agent).frozen_at IS NULL
       AND (o_tenant).deleted_at IS NULL AND (o_tenant).frozen_at IS NULL THEN
        INSERT INTO portal_agentrequestwindow AS w (
            id, agent_id, tenant_id, window_start, requests
        )
        VALUES (
            gen_random_uuid(), (o_agent).id, (o_agent).tenant_id,
            to_timestamp(floor(extract(epoch FROM app_now()) / p_window_s) * p_window_s),
            1
        )
        ON CONFLICT (tenant_id, agent_id) DO UPDATE SET
            requests = CASE WHEN w.window_start = EXCLUDED.window_start
                            THEN w.requests + 1 ELSE 1 END,
            window_start = EXCLUDED.window_start
        RETURNING w.requests,
            extract(epoch FROM w.window_start + make_interval(secs => p_window_s) - app_now())
        INTO o_requests, o_left_s;
    END IF;
    PERFORM set_config('portal.tenant_ids', coalesce(v_scope, ''), true);
    IF v_found THEN
        RETURN NEXT;
    END IF;
END $$;
"""

REVERSE = """
DROP FUNCTION portal_agent_key_authenticate(text, text, integer);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0015_invitation"),
        # portal_agent_key_tenant(), the discovery function it calls.
        ("tasks", "0017_row_level_security_everywhere"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
