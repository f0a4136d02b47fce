"""The key's last-used mark joins the authenticating statement.

``portal_agent_key_authenticate`` (portal migration 0016) gains ``p_mark_used_s``:
given, a key that authenticates (live, agent active and not frozen, tenant neither
deleted nor frozen) whose ``last_used_at`` is unset or older than that many seconds
gets ``last_used_at = app_now()`` in the same statement. Until now the mark was a
statement of its own after the lookup (``portal.services.agent_key_mark_used``, at
most once a minute per key and process): one round trip fewer when it is written,
and the once-a-minute rule is decided on the row itself, shared by every process
(docs/performance-log.md, "Issue 23: the REST request's CPU in the web").
Otherwise the function is 0016's, unchanged.
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
DROP FUNCTION portal_agent_key_authenticate(text, text, integer);

CREATE FUNCTION portal_agent_key_authenticate(
    p_prefix text, p_key_hash text, p_window_s integer, p_mark_used_s integer
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
    v_live boolean;
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
    -- A key that authenticates and whose agent and tenant are not frozen.
    v_live := v_found AND (o_key).revoked_at IS NULL AND NOT o_expired
        AND (o_agent).is_active AND (o_agent).frozen_at IS NULL
        AND (o_tenant).deleted_at IS NULL AND (o_tenant).frozen_at IS NULL;
    IF v_live AND p_window_s IS NOT NULL THEN
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
    -- The last-used mark: a write at most once per p_mark_used_s per key, decided
    -- on the row just read; the UPDATE's own condition keeps two requests racing
    -- past the first check to one write.
    IF v_live AND p_mark_used_s IS NOT NULL AND ((o_key).last_used_at IS NULL
       OR (o_key).last_used_at < app_now() - make_interval(secs => p_mark_used_s)) THEN
        UPDATE portal_agentkey SET last_used_at = app_now()
        WHERE id = (o_key).id AND tenant_id = (o_key).tenant_id
          AND (last_used_at IS NULL
               OR last_used_at < app_now() - make_interval(secs => p_mark_used_s));
    END IF;
    PERFORM set_config('portal.tenant_ids', coalesce(v_scope, ''), true);
    IF v_found THEN
        RETURN NEXT;
    END IF;
END $$;
"""

REVERSE = """
DROP FUNCTION portal_agent_key_authenticate(text, text, integer, integer);

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


class Migration(migrations.Migration):
    dependencies = [("portal", "0016_agent_key_authenticate")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
