"""A purged tenant's log ends in a signed tombstone (issue 19 §2).

- ``tenant_deletion_tombstone``: one row per purged tenant, the signed tombstone
  note over its log's final size and root (tenant_deletion/models.py). Append-only
  like the log (``audit_tlog_append_only``: only the owner deletes, as the test
  suite's flush does), no ``TRUNCATE`` but the owner's; the app role only reads it
  and the operator inserts it (``portal.db_roles``); forced row-level security
  with the tenant scope, like every table with a ``tenant_id``.
- ``tenant_deletion_purge`` (same signature) keeps the log's leaves and heads under
  ``purge`` (audit migration 0024 dropped their foreign key to the tenant) and
  refuses to purge unless the tenant's tombstone is there and describes the log as
  it stands: its size is the number of leaves and the newest head's size, its root
  the newest head's root (the empty tree's hash for a log never signed), and its
  note's body is the tenant's origin, that size, that root and the tombstone line.
  The signature is not checked here (``verify_audit`` checks it with the public
  key); the shape ties the tombstone to this log.
- ``audit_tenants_with_log()``: a discovery function (docs/database-roles.md): the
  tenant ids that have signed log heads or a tombstone, so ``verify_audit`` finds
  the purged tenants and a log whose tenant row is gone without a tombstone.
"""

from __future__ import annotations

from django.db import migrations, models

SEARCH_PATH = "pg_catalog, public, pg_temp"  # as in migration 0001
DISCOVERY_ROLE = "portal_discovery"  # portal.db_roles.DISCOVERY_ROLE
EMPTY_ROOT = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
ORIGIN_PREFIX = "agent-governance-portal/tenants/"  # audit.tlog.ORIGIN_PREFIX
TOMBSTONE_LINE = "tombstone: tenant purged"  # audit.tlog.TOMBSTONE_LINE

TOMBSTONE_GUARDS = """
ALTER TABLE tenant_deletion_tombstone ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_deletion_tombstone FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_deletion_tombstone_tenant_scope ON tenant_deletion_tombstone
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
CREATE TRIGGER tenant_deletion_tombstone_append_only_trg
    BEFORE UPDATE OR DELETE ON tenant_deletion_tombstone
    FOR EACH ROW EXECUTE FUNCTION audit_tlog_append_only();
CREATE TRIGGER tenant_deletion_tombstone_truncate_trg
    BEFORE TRUNCATE ON tenant_deletion_tombstone
    FOR EACH STATEMENT EXECUTE FUNCTION portal_truncate_guard();
"""

PURGE = f"""
CREATE OR REPLACE FUNCTION tenant_deletion_purge(p_tenant uuid)
RETURNS TABLE (relation text, deleted bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {SEARCH_PATH} AS $$
DECLARE
    v_policy text;
    v_deleted_at timestamptz;
    v_table text;
    v_leaves bigint;
    v_head_size bigint;
    v_head_root text;
    v_body text;
    v_tombstone public.tenant_deletion_tombstone%ROWTYPE;
BEGIN
    -- FORCE row-level security binds the owner too: without the tenant in the
    -- caller's scope, "no tasks left" would be blind.
    IF p_tenant IS NULL OR NOT p_tenant = ANY (
        coalesce(public.portal_tenant_scope(), '{{}}'::uuid[])
    ) THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % is not in scope', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The decision comes from the locked row; only the owner and the operator may
    -- update these two columns.
    SELECT t.events_on_delete, t.deleted_at INTO v_policy, v_deleted_at
    FROM public.portal_tenant t WHERE t.id = p_tenant FOR UPDATE;
    IF NOT FOUND OR v_deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % is gone or deleted', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT 1 FROM public.tasks_task t WHERE t.tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % still has tasks', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    relation := 'tasks_contract';
    DELETE FROM public.tasks_contract c WHERE c.tenant_id = p_tenant;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
    IF v_policy <> 'purge' THEN
        UPDATE public.portal_tenant SET deleted_at = public.app_now()
        WHERE id = p_tenant;
        RETURN;
    END IF;
    -- The log stays and must end in its tombstone: the log as it stands now.
    SELECT * INTO v_tombstone FROM public.tenant_deletion_tombstone t
    WHERE t.tenant_id = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant % has no tombstone', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT count(*) INTO v_leaves FROM public.audit_logentry l
    WHERE l.tenant_id = p_tenant;
    SELECT h.size, h.root_hash INTO v_head_size, v_head_root
    FROM public.audit_treehead h WHERE h.tenant_id = p_tenant
    ORDER BY h.size DESC LIMIT 1;
    v_body := '{ORIGIN_PREFIX}' || p_tenant || E'\\n' || v_tombstone.size || E'\\n'
        || encode(decode(v_tombstone.root_hash, 'hex'), 'base64')
        || E'\\n{TOMBSTONE_LINE}\\n\\n';
    IF v_tombstone.size <> v_leaves
        OR v_tombstone.size <> coalesce(v_head_size, 0)
        OR v_tombstone.root_hash <> coalesce(v_head_root, '{EMPTY_ROOT}')
        OR left(v_tombstone.note, length(v_body)) <> v_body
    THEN
        RAISE EXCEPTION 'tenant_deletion_purge: tenant %''s tombstone is not its log''s last head',
            p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The trail and what vouches for it, then the tenant row itself: a tenant
    -- row that any other table still references stops the whole deletion. The
    -- log's leaves and heads stay (no foreign key to the tenant).
    FOREACH v_table IN ARRAY ARRAY[
        'audit_event', 'audit_checkpoint', 'audit_retentionanchor',
        'audit_retentionpurge', 'audit_chainhead', 'portal_tenant'
    ] LOOP
        relation := v_table;
        EXECUTE format(
            'DELETE FROM public.%I WHERE %I = $1', v_table,
            CASE v_table WHEN 'portal_tenant' THEN 'id' ELSE 'tenant_id' END
        ) USING p_tenant;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        RETURN NEXT;
    END LOOP;
END $$;
"""

DISCOVERY = f"""
GRANT CREATE ON SCHEMA public TO {DISCOVERY_ROLE};
GRANT SELECT (tenant_id) ON audit_treehead TO {DISCOVERY_ROLE};
GRANT SELECT (tenant_id) ON tenant_deletion_tombstone TO {DISCOVERY_ROLE};
CREATE FUNCTION audit_tenants_with_log() RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {SEARCH_PATH} AS $$
    SELECT h.tenant_id FROM audit_treehead h
    UNION
    SELECT t.tenant_id FROM tenant_deletion_tombstone t
$$;
REVOKE ALL ON FUNCTION audit_tenants_with_log() FROM PUBLIC;
ALTER FUNCTION audit_tenants_with_log() OWNER TO {DISCOVERY_ROLE};
REVOKE CREATE ON SCHEMA public FROM {DISCOVERY_ROLE};
"""

NO_DISCOVERY = f"""
DROP FUNCTION audit_tenants_with_log();
REVOKE SELECT (tenant_id) ON audit_treehead FROM {DISCOVERY_ROLE};
REVOKE SELECT (tenant_id) ON tenant_deletion_tombstone FROM {DISCOVERY_ROLE};
"""


def _previous_purge() -> str:
    from importlib import import_module

    previous = import_module("tenant_deletion.migrations.0002_purge_transparency_log")
    return str(previous.FORWARD)


class Migration(migrations.Migration):
    dependencies = [
        ("tenant_deletion", "0002_purge_transparency_log"),
        ("audit", "0024_log_outlives_its_tenant"),
    ]

    operations = [
        migrations.CreateModel(
            name="Tombstone",
            fields=[
                ("tenant_id", models.UUIDField(primary_key=True, serialize=False)),
                ("slug", models.CharField(max_length=64)),
                ("size", models.BigIntegerField()),
                ("root_hash", models.CharField(max_length=64)),
                ("note", models.TextField()),
                ("key_id", models.CharField(max_length=16)),
                ("signed_at", models.DateTimeField()),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("size__gte", 0)),
                        name="tenant_deletion_tombstone_size_check",
                    )
                ],
            },
        ),
        migrations.RunSQL(TOMBSTONE_GUARDS, migrations.RunSQL.noop),
        migrations.RunSQL(PURGE, _previous_purge()),
        migrations.RunSQL(DISCOVERY, NO_DISCOVERY),
    ]
