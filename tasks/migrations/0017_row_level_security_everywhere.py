"""Row-level security on every remaining tenant-owned table, and the one narrow way
across tenants: the discovery functions (docs/database-roles.md).

The twelve tables that work spanning tenants or log-in read across tenants get what
``0012_row_level_security`` gave the first seven: ``ENABLE`` and ``FORCE ROW LEVEL
SECURITY`` and the scope policy. ``audit_event``'s month partitions get them too (a
query through the parent is checked against the parent alone, but the owner's
retention functions reach a partition directly), and ``audit_event_partition_create``
copies the parent's policies onto each new month.

Work across tenants first asks which tenants have work of one kind, then does it
under exactly that scope with the same policies. The asking is done by
``SECURITY DEFINER`` functions owned by ``portal_discovery``, a ``NOLOGIN``
``BYPASSRLS`` role (``portal/db_roles.py`` makes it; the owner is its member only so
that this migration can hand the functions over). Each returns tenant ids and
nothing else; the role may read only the columns the functions filter on
(column-level ``SELECT``), owns nothing else, and the app role may execute the
functions (``APP_GRANTS``), nobody else.

Retention's global horizon and the tenant purge read "every tenant": they now refuse
to run unless every tenant is in the caller's scope (or, for the purge, the tenant
it purges), rather than seeing a part and acting on it.
"""

from __future__ import annotations

from django.db import migrations

DISCOVERY_ROLE = "portal_discovery"

TABLES = (
    "audit_checkpoint",
    "audit_event",
    "audit_outbox",
    "audit_retentionanchor",
    "audit_retentionpolicy",
    "audit_retentionpurge",
    "portal_agent",
    "portal_agentkey",
    "portal_idempotentrequest",
    "portal_membership",
    "tasks_operation",
    "tasks_task",
)

POLICY = """
ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
CREATE POLICY {table}_tenant_scope ON {table}
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
"""

NO_POLICY = """
DROP POLICY {table}_tenant_scope ON {table};
ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY;
ALTER TABLE {table} DISABLE ROW LEVEL SECURITY;
"""

# What the discovery role may read: the tenant and the columns each function
# filters on, nothing else.
DISCOVERY_COLUMNS = {
    "tasks_task": "tenant_id, state, lease_owner, lease_expires_at, wake_at",
    "tasks_operation": "tenant_id, state, next_check_at, authorized_at",
    "audit_outbox": "tenant_id, state, available_at",
    "portal_idempotentrequest": "tenant_id, expires_at",
    "portal_agentkey": "tenant_id, prefix, key_hash",
    "portal_membership": "tenant_id, user_id",
    "portal_test_clock": "backend_pid, clock_offset",  # app_now() in tests
}

# (name, arguments, their types, body); each returns tenant ids only.
DISCOVERY_FUNCTIONS = (
    (
        "tasks_tenants_with_lapsed_leases",
        "",
        "",
        """SELECT DISTINCT t.tenant_id FROM tasks_task t
    WHERE t.lease_owner IS NOT NULL AND t.lease_expires_at <= app_now()
      AND t.state IN ('pending', 'running', 'waiting', 'human_claimed')""",
    ),
    (
        "tasks_tenants_with_waking_tasks",
        "",
        "",
        """SELECT DISTINCT t.tenant_id FROM tasks_task t
    WHERE t.state = 'waiting' AND t.wake_at <= app_now()""",
    ),
    (
        "tasks_tenants_with_due_operations",
        "",
        "",
        """SELECT DISTINCT o.tenant_id FROM tasks_operation o
    WHERE o.next_check_at <= app_now() AND (
        o.state IN ('executing', 'unknown')
        OR (o.state = 'reserved' AND o.authorized_at IS NOT NULL))""",
    ),
    (
        "audit_tenants_with_due_outbox",
        "",
        "",
        """SELECT DISTINCT o.tenant_id FROM audit_outbox o
    WHERE o.state = 'pending' AND o.available_at <= app_now()""",
    ),
    (
        "portal_tenants_with_expired_idempotency",
        "",
        "",
        """SELECT DISTINCT r.tenant_id FROM portal_idempotentrequest r
    WHERE r.expires_at <= app_now()""",
    ),
    # Log-in: the presented key's tenant (prefix and hash must both match), and a
    # signed-in person's tenants.
    (
        "portal_agent_key_tenant",
        "p_prefix text, p_key_hash text",
        "text, text",
        """SELECT k.tenant_id FROM portal_agentkey k
    WHERE k.prefix = p_prefix AND k.key_hash = p_key_hash""",
    ),
    (
        "portal_person_tenants",
        "p_user integer",
        "integer",
        "SELECT m.tenant_id FROM portal_membership m WHERE m.user_id = p_user",
    ),
)

DISCOVERY = f"""
DO $discovery$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{DISCOVERY_ROLE}') THEN
        RAISE EXCEPTION 'role {DISCOVERY_ROLE} is missing'
            USING HINT = 'portal.db_roles.ensure_roles makes it (manage.py up and '
                         'the test suite call it; README, "Database roles")';
    END IF;
END $discovery$;
-- Only while this migration hands the functions over (ALTER … OWNER needs it).
GRANT CREATE ON SCHEMA public TO {DISCOVERY_ROLE};
"""
for _table, _columns in DISCOVERY_COLUMNS.items():
    DISCOVERY += f"GRANT SELECT ({_columns}) ON {_table} TO {DISCOVERY_ROLE};\n"
for _name, _arguments, _types, _body in DISCOVERY_FUNCTIONS:
    DISCOVERY += f"""
CREATE FUNCTION {_name}({_arguments}) RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    {_body}
$$;
REVOKE ALL ON FUNCTION {_name}({_types}) FROM PUBLIC;
ALTER FUNCTION {_name}({_types}) OWNER TO {DISCOVERY_ROLE};
"""
DISCOVERY += f"REVOKE CREATE ON SCHEMA public FROM {DISCOVERY_ROLE};\n"

NO_DISCOVERY = "".join(
    f"DROP FUNCTION {name}({types});\n" for name, _, types, _ in DISCOVERY_FUNCTIONS
) + "".join(
    f"REVOKE SELECT ({columns}) ON {table} FROM {DISCOVERY_ROLE};\n"
    for table, columns in DISCOVERY_COLUMNS.items()
)

# The partitions: the parent's row-level security and policy on each existing one,
# and on each one made from now on.
PARTITIONS = """
DO $partitions$
DECLARE
    v_part record;
BEGIN
    FOR v_part IN SELECT name FROM audit_event_partitions() LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', v_part.name);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', v_part.name);
        EXECUTE format(
            'CREATE POLICY audit_event_tenant_scope ON %I'
            ' USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))'
            ' WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))',
            v_part.name);
    END LOOP;
END $partitions$;
"""

NO_PARTITIONS = """
DO $partitions$
DECLARE
    v_part record;
BEGIN
    FOR v_part IN SELECT name FROM audit_event_partitions() LOOP
        EXECUTE format('DROP POLICY IF EXISTS audit_event_tenant_scope ON %I',
                       v_part.name);
        EXECUTE format('ALTER TABLE %I NO FORCE ROW LEVEL SECURITY', v_part.name);
        EXECUTE format('ALTER TABLE %I DISABLE ROW LEVEL SECURITY', v_part.name);
    END LOOP;
END $partitions$;
"""

PARTITION_CREATE = """
CREATE OR REPLACE FUNCTION audit_event_partition_create(p_month date) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_start timestamp := date_trunc('month', p_month::timestamp);
    v_from uuid := audit_uuid7_floor(v_start AT TIME ZONE 'UTC');
    v_to uuid := audit_uuid7_floor((v_start + interval '1 month') AT TIME ZONE 'UTC');
    v_name text := 'audit_event_p' || to_char(v_start, 'YYYYMM');
    v_covered uuid;
    v_trigger record;
    v_parent record;
    v_policy record;
BEGIN
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    -- One creator at a time; the next one sees the partition.
    PERFORM pg_advisory_xact_lock(hashtextextended('audit.partition_create', 0));
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT p.upper_id INTO v_covered FROM audit_event_partitions() p
    WHERE (p.lower_id IS NULL OR p.lower_id < v_to) AND p.upper_id > v_from
    ORDER BY p.upper_id DESC LIMIT 1;
    IF v_covered IS NOT NULL THEN
        IF v_covered >= v_to THEN
            RETURN NULL;  -- an earlier partition covers the whole month
        END IF;
        v_from := v_covered;
    END IF;
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF audit_event FOR VALUES FROM (%L) TO (%L)',
        v_name, v_from, v_to);
    -- A chain is a line inside each partition (see the migration's docstring).
    EXECUTE format(
        'CREATE UNIQUE INDEX %I ON %I (tenant_id, task_id, chain_seq) '
        'WHERE task_id IS NOT NULL', v_name || '_task_chain_uniq', v_name);
    EXECUTE format(
        'CREATE UNIQUE INDEX %I ON %I (tenant_id, chain_seq) WHERE task_id IS NULL',
        v_name || '_tenant_chain_uniq', v_name);
    -- Row-level security, its policies and statement triggers are not inherited:
    -- copy them.
    SELECT relrowsecurity, relforcerowsecurity INTO v_parent FROM pg_class
    WHERE oid = 'audit_event'::regclass;
    IF v_parent.relrowsecurity THEN
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', v_name);
    END IF;
    IF v_parent.relforcerowsecurity THEN
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', v_name);
    END IF;
    FOR v_policy IN
        SELECT p.polname, pg_get_expr(p.polqual, p.polrelid) AS qual,
               pg_get_expr(p.polwithcheck, p.polrelid) AS checked
        FROM pg_policy p
        WHERE p.polrelid = 'audit_event'::regclass AND p.polcmd = '*'
          AND p.polpermissive AND p.polroles = '{0}'
    LOOP
        EXECUTE format('CREATE POLICY %I ON %I USING (%s) WITH CHECK (%s)',
                       v_policy.polname, v_name, v_policy.qual, v_policy.checked);
    END LOOP;
    FOR v_trigger IN
        SELECT t.tgname, t.tgfoid::regproc AS func, t.tgenabled FROM pg_trigger t
        WHERE t.tgrelid = 'audit_event'::regclass AND NOT t.tgisinternal
          AND (t.tgtype & 1) = 0 AND (t.tgtype & 32) <> 0  -- statement, TRUNCATE
    LOOP
        EXECUTE format(
            'CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
            'EXECUTE FUNCTION %s()', v_trigger.tgname, v_name, v_trigger.func);
        IF v_trigger.tgenabled = 'A' THEN
            EXECUTE format('ALTER TABLE %I ENABLE ALWAYS TRIGGER %I',
                           v_name, v_trigger.tgname);
        END IF;
    END LOOP;
    RETURN v_name;
END $$;
"""

# Retention's "every tenant" must be every tenant: refused, not guessed from a part,
# when a tenant is outside the caller's scope (it would see none of its policy,
# pending outbox rows or purge records).
GLOBAL_HORIZON = """
CREATE OR REPLACE FUNCTION audit_retention_global_horizon(p_default_months integer)
RETURNS uuid LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
DECLARE
    v_horizon uuid;
BEGIN
    IF EXISTS (
        SELECT 1 FROM portal_tenant t
        WHERE NOT t.id = ANY (coalesce(portal_tenant_scope(), '{}'::uuid[]))
    ) THEN
        RAISE EXCEPTION 'retention across tenants needs every tenant in scope'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT h INTO v_horizon FROM (
        SELECT audit_retention_horizon(t.id, p_default_months) AS h
        FROM portal_tenant t
    ) horizons ORDER BY h LIMIT 1;
    RETURN v_horizon;
END $$;
"""

NO_GLOBAL_HORIZON = """
CREATE OR REPLACE FUNCTION audit_retention_global_horizon(p_default_months integer)
RETURNS uuid LANGUAGE sql STABLE SET search_path = public, pg_temp AS $$
SELECT h FROM (
    SELECT audit_retention_horizon(t.id, p_default_months) AS h FROM portal_tenant t
) horizons ORDER BY h LIMIT 1
$$;
"""

# The tenant purge's "no tasks left" check reads tasks_task, which is now scoped:
# the purged tenant must be in the caller's scope, or the check would see nothing.
PURGE = """
CREATE OR REPLACE FUNCTION tasks_purge_tenant_rows(p_table regclass, p_tenant uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    deleted bigint;
BEGIN
    IF p_table NOT IN ('public.tasks_contract'::regclass,
                       'public.audit_event'::regclass,
                       'public.audit_checkpoint'::regclass,
                       'public.audit_retentionpurge'::regclass,
                       'public.audit_retentionanchor'::regclass) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: % is not purged this way', p_table
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_tenant IS NULL OR NOT p_tenant = ANY (
        coalesce(public.portal_tenant_scope(), '{}'::uuid[])
    ) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: tenant % is not in scope', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT 1 FROM public.tasks_task t WHERE t.tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: tenant % still has tasks', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_table <> 'public.tasks_contract'::regclass AND NOT EXISTS (
        SELECT 1 FROM public.portal_tenant t
        WHERE t.id = p_tenant AND t.events_on_delete = 'purge'
    ) THEN
        RAISE EXCEPTION 'tasks_purge_tenant_rows: tenant % keeps its events', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    EXECUTE format('DELETE FROM %s WHERE tenant_id = $1', p_table) USING p_tenant;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END $$;
"""

FORWARD = (
    "".join(POLICY.format(table=t) for t in TABLES)
    + PARTITIONS
    + PARTITION_CREATE
    + GLOBAL_HORIZON
    + PURGE
    + DISCOVERY
)
REVERSE = (
    NO_DISCOVERY
    + NO_GLOBAL_HORIZON
    + NO_PARTITIONS
    + "".join(NO_POLICY.format(table=t) for t in TABLES)
)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0016_task_tenant_no_single_index"),
        ("audit", "0015_drop_redundant_indexes"),
        ("portal", "0008_agentkey_expiry"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
