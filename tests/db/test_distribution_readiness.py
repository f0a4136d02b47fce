"""What stands between the schema and distributing it by ``tenant_id`` (issue 12 §6).

Citus shards a table by one column and checks uniqueness and foreign keys only inside
a shard: a distributed table's primary key and unique constraints must include the
distribution column, a foreign key between two distributed tables must join them on
it, and a reference table (one copy on every node) may not point into a distributed
table (citus_docs, develop/reference_ddl.rst, "Adding/Removing Constraints").

The walk reads pg_catalog of the migrated test database. Every table with a
``tenant_id`` column is a candidate for distribution by it; every other table must be
classified here as reference, coordinator-only or consumer-side. What would stop
``create_distributed_table`` is compared with ``KNOWN_BLOCKERS``: a new blocker fails
the test, and so does a fixed one still listed (remove it). docs/scale-out.md explains
each entry and the order to fix them in.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

# Tables that carry tenant_id: distributed by it, co-located with each other.
DISTRIBUTED = frozenset(
    {
        "audit_chainhead",
        "audit_checkpoint",
        "audit_event",  # partitioned by id (month ranges); the partitions follow it
        "audit_headstamp",
        "audit_logentry",
        "audit_outbox",
        "audit_retentionanchor",
        "audit_retentionpolicy",
        "audit_retentionpurge",
        "audit_treehead",
        "console_deskcomment",
        "limits_budget",
        "limits_limitusage",
        "limits_ratelimit",
        "policies_policyset",
        "portal_agent",
        "portal_agentgrant",
        "portal_agentkey",
        "portal_agentrequestwindow",  # UNLOGGED (portal migration 0010)
        "portal_idempotentrequest",
        "portal_invitation",
        "portal_membership",
        "routing_assignment",
        "routing_group",
        "routing_groupmember",
        "routing_notification",
        "routing_routingrule",
        "routing_webhook",
        "tasks_approval",
        "tasks_approvaldecision",
        "tasks_connector",
        "tasks_contract",
        "tasks_credential",
        "tasks_escalation",
        "tasks_objectversion",
        "tasks_operation",
        "tasks_task",
        "tenant_deletion_tombstone",  # its primary key is the (purged) tenant's id
        "tenant_deletion_tombstonestamp",
    }
)
# Small, global, read far more than written: one copy on every node, so any shard can
# join them and distributed tables may keep their foreign keys into them.
REFERENCE = frozenset(
    {
        "portal_tenant",
        "auth_user",
        "auth_group",
        "auth_permission",
        "auth_group_permissions",
        "auth_user_groups",
        "auth_user_user_permissions",
        "django_content_type",
        "guardian_groupobjectpermission",
        "guardian_userobjectpermission",
    }
)
# Never joined with tenant rows on a shard: they stay on the coordinator.
COORDINATOR = frozenset(
    {
        "django_migrations",
        "django_session",
        "django_admin_log",
        "portal_test_clock",  # the test clock's per-backend offsets
        "portal_jobrun",  # each Celery job's last run (portal/jobruns.py)
        "console_savedsearch",  # a person's saved event searches (not a tenant's)
        "console_usedformtoken",  # spent one-time form tokens (console/once.py)
        "portal_authfailurewindow",  # failed API authentications (portal/api.py)
        # django-axes' login attempts and lockouts (docs/portal.md)
        "axes_accessattempt",
        "axes_accessattemptexpiration",
        "axes_accessfailurelog",
        "axes_accesslog",
    }
)
# A consumer's tables (docs/outbox.md, "the inbox pattern"): they live in the
# consumer's own database; the tests make them in this one.
CONSUMER = frozenset({"audit_inbox"})
# Made by examples/outbox_consumer.py when tests/worker ran first in the session.
OPTIONAL = frozenset({"example_topic_count"})


@dataclass(frozen=True, order=True)
class Blocker:
    table: str
    kind: str
    constraint: str
    detail: str


def B(table: str, kind: str, constraint: str, detail: str) -> Blocker:
    return Blocker(table, kind, constraint, detail)


_PK = "primary key without tenant_id"
_UNIQUE = "unique without tenant_id"
_UNIQUE_INDEX = "unique index without tenant_id"
_EXCLUSION = "exclusion constraint without tenant_id"
_FK_OFF = "foreign key between distributed tables not on tenant_id"
_FK_INTO = "foreign key from a non-distributed table into a distributed one"

# What is not yet distributable. Fix one (e.g. a primary key made (tenant_id, id)) and
# delete its line here; a new one fails the test until it is fixed or listed here
# with a reason in docs/scale-out.md.
KNOWN_BLOCKERS = frozenset(
    {
        # Every tenant table's own key is its id alone (Django's default primary key).
        # The composite (id, tenant_id) unique constraints the composite foreign keys
        # point at already exist: they become the primary keys.
        B("audit_chainhead", _PK, "audit_chainhead_pkey", "(id)"),
        B("audit_checkpoint", _PK, "audit_checkpoint_pkey", "(id)"),
        B("audit_event", _PK, "audit_event_pkey", "(id)"),
        B("audit_headstamp", _PK, "audit_headstamp_pkey", "(id)"),
        B("audit_logentry", _PK, "audit_logentry_pkey", "(id)"),
        B("audit_outbox", _PK, "audit_outbox_pkey", "(id)"),
        B("audit_retentionanchor", _PK, "audit_retentionanchor_pkey", "(id)"),
        B("audit_retentionpolicy", _PK, "audit_retentionpolicy_pkey", "(id)"),
        B("audit_retentionpurge", _PK, "audit_retentionpurge_pkey", "(id)"),
        B("audit_treehead", _PK, "audit_treehead_pkey", "(id)"),
        B("console_deskcomment", _PK, "console_deskcomment_pkey", "(id)"),
        B("limits_budget", _PK, "limits_budget_pkey", "(id)"),
        B("limits_limitusage", _PK, "limits_limitusage_pkey", "(id)"),
        B("limits_ratelimit", _PK, "limits_ratelimit_pkey", "(id)"),
        B("policies_policyset", _PK, "policies_policyset_pkey", "(id)"),
        B("portal_agent", _PK, "portal_agent_pkey", "(id)"),
        B("portal_agentgrant", _PK, "portal_agentgrant_pkey", "(id)"),
        B("portal_agentkey", _PK, "portal_agentkey_pkey", "(id)"),
        B("portal_agentrequestwindow", _PK, "portal_agentrequestwindow_pkey", "(id)"),
        B("portal_idempotentrequest", _PK, "portal_idempotentrequest_pkey", "(id)"),
        B("portal_invitation", _PK, "portal_invitation_pkey", "(id)"),
        B("portal_membership", _PK, "portal_membership_pkey", "(id)"),
        B("routing_assignment", _PK, "routing_assignment_pkey", "(id)"),
        B("routing_group", _PK, "routing_group_pkey", "(id)"),
        B("routing_groupmember", _PK, "routing_groupmember_pkey", "(id)"),
        B("routing_notification", _PK, "routing_notification_pkey", "(id)"),
        B("routing_routingrule", _PK, "routing_routingrule_pkey", "(id)"),
        B("routing_webhook", _PK, "routing_webhook_pkey", "(id)"),
        B("tasks_approval", _PK, "tasks_approval_pkey", "(id)"),
        B("tasks_approvaldecision", _PK, "tasks_approvaldecision_pkey", "(id)"),
        B("tasks_connector", _PK, "tasks_connector_pkey", "(id)"),
        B("tasks_contract", _PK, "tasks_contract_pkey", "(id)"),
        B("tasks_credential", _PK, "tasks_credential_pkey", "(id)"),
        B("tasks_escalation", _PK, "tasks_escalation_pkey", "(id)"),
        B("tasks_objectversion", _PK, "tasks_objectversion_pkey", "(id)"),
        B("tasks_operation", _PK, "tasks_operation_pkey", "(id)"),
        B("tasks_task", _PK, "tasks_task_pkey", "(id)"),
        B(
            "tenant_deletion_tombstonestamp",
            _PK,
            "tenant_deletion_tombstonestamp_pkey",
            "(id)",
        ),
        # An API key is looked up by its prefix before the tenant is known: globally
        # unique by design. Needs a global lookup (a reference table of prefixes).
        B("portal_agentkey", _UNIQUE, "portal_agentkey_prefix_key", "(prefix)"),
        # An invitation's link is looked up by its token's hash before the person has
        # a tenant: the same kind of global lookup as the key prefix.
        B(
            "portal_invitation",
            _UNIQUE,
            "portal_invitation_token_hash_key",
            "(token_hash)",
        ),
    }
)

# Serial (sequence-fed) columns of distributed tables: every other tenant table's id
# is a UUID made by the application, which needs no coordination between nodes.
KNOWN_SEQUENCES = frozenset(
    {
        ("audit_chainhead", "id"),
        ("audit_retentionanchor", "id"),
        ("audit_retentionpolicy", "id"),
    }
)

_TABLES = """
SELECT c.relname,
       EXISTS (SELECT 1 FROM pg_attribute a
               WHERE a.attrelid = c.oid AND a.attname = 'tenant_id'
                 AND NOT a.attisdropped)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
"""

# Keys and unique indexes of one schema's tables (partitions follow their parent), with
# their columns in order; for a foreign key the referenced table and columns.
_KEYS = """
WITH rel AS (
    SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
)
SELECT rel.relname, k.contype::text, k.conname,
       ARRAY(SELECT a.attname FROM unnest(k.conkey) WITH ORDINALITY u(n, o)
             JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n
             ORDER BY u.o)::text[],
       k.confrelid::regclass::text,
       ARRAY(SELECT a.attname FROM unnest(k.confkey) WITH ORDINALITY u(n, o)
             JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = u.n
             ORDER BY u.o)::text[]
FROM rel JOIN pg_constraint k ON k.conrelid = rel.oid
WHERE k.contype IN ('p', 'u', 'x', 'f')
UNION ALL
SELECT rel.relname, 'i', i.relname,
       ARRAY(SELECT coalesce(a.attname, '(expression)')
             FROM unnest(x.indkey::int2[]) WITH ORDINALITY u(n, o)
             LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = u.n
             ORDER BY u.o)::text[],
       NULL, NULL
FROM rel JOIN pg_index x ON x.indrelid = rel.oid JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indisunique
  AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid)
"""

_SEQUENCES = """
SELECT c.relname, a.attname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND pg_get_serial_sequence(quote_ident(n.nspname) || '.' || quote_ident(c.relname),
                             a.attname) IS NOT NULL
"""


def tables_by_tenant_id(cursor, schema: str = "public") -> dict[str, bool]:
    """Every table of ``schema`` (partitions left out): does it have tenant_id?"""
    cursor.execute(_TABLES, {"schema": schema})
    return dict(cursor.fetchall())


def distribution_blockers(cursor, schema: str = "public") -> set[Blocker]:
    """What would stop distributing every tenant_id table of ``schema`` by it."""
    distributed = {t for t, has in tables_by_tenant_id(cursor, schema).items() if has}
    cursor.execute(_KEYS, {"schema": schema})
    found = set()
    for table, kind, name, columns, ref_table, ref_columns in cursor.fetchall():
        cols = "(" + ", ".join(columns) + ")"
        if kind == "f":
            ref = ref_table.split(".")[-1].strip('"')
            if ref not in distributed:
                continue  # into a reference table: allowed from anywhere
            target = f"{cols} -> {ref} (" + ", ".join(ref_columns) + ")"
            if table not in distributed:
                found.add(B(table, _FK_INTO, name, target))
            elif ("tenant_id", "tenant_id") not in zip(
                columns, ref_columns, strict=True
            ):
                found.add(B(table, _FK_OFF, name, target))
        elif table in distributed and "tenant_id" not in columns:
            label = {"p": _PK, "u": _UNIQUE, "x": _EXCLUSION, "i": _UNIQUE_INDEX}
            found.add(B(table, label[kind], name, cols))
    return found


def serial_columns(cursor, schema: str = "public") -> set[tuple[str, str]]:
    """(table, column) of every sequence-fed column of a tenant_id table."""
    distributed = {t for t, has in tables_by_tenant_id(cursor, schema).items() if has}
    cursor.execute(_SEQUENCES, {"schema": schema})
    return {
        (table, column) for table, column in cursor.fetchall() if table in distributed
    }


def drift(found: set, known: frozenset) -> list[str]:
    """Differences between the catalog and the committed list, as readable lines."""
    return [f"new, not in the list: {b}" for b in sorted(found - known)] + [
        f"fixed, delete from the list: {b}" for b in sorted(known - found)
    ]


def test_every_table_is_classified():
    with connection.cursor() as cursor:
        tables = tables_by_tenant_id(cursor)
    with_tenant = {t for t, has in tables.items() if has}
    without = set(tables) - with_tenant
    assert with_tenant == DISTRIBUTED, (
        "tenant_id tables not in DISTRIBUTED:",
        sorted(with_tenant - DISTRIBUTED),
        "in DISTRIBUTED but gone or without tenant_id:",
        sorted(DISTRIBUTED - with_tenant),
    )
    classified = REFERENCE | COORDINATOR | CONSUMER
    assert without - OPTIONAL == classified, (
        "unclassified tables without tenant_id:",
        sorted(without - classified - OPTIONAL),
        "classified but gone (or given a tenant_id):",
        sorted(classified - without),
    )


def test_blockers_are_exactly_the_known_ones():
    with connection.cursor() as cursor:
        found = distribution_blockers(cursor)
    assert drift(found, KNOWN_BLOCKERS) == []


def test_serial_columns_are_exactly_the_known_ones():
    with connection.cursor() as cursor:
        found = serial_columns(cursor)
    assert drift(found, KNOWN_SEQUENCES) == []


def test_the_walk_reports_a_new_blocker_and_a_fixed_one():
    """Both directions fail: on temporary tables in this test's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE TEMP TABLE probe_ref (id int PRIMARY KEY);
            CREATE TEMP TABLE probe_parent (
                id uuid PRIMARY KEY, tenant_id uuid NOT NULL, code text UNIQUE,
                UNIQUE (id, tenant_id));
            CREATE TEMP TABLE probe_child (
                id uuid, tenant_id uuid NOT NULL, parent_id uuid,
                ref_id int REFERENCES probe_ref (id),
                PRIMARY KEY (tenant_id, id),
                CONSTRAINT probe_child_parent_fk FOREIGN KEY (parent_id)
                    REFERENCES probe_parent (id),
                CONSTRAINT probe_child_parent_same_tenant_fk
                    FOREIGN KEY (parent_id, tenant_id)
                    REFERENCES probe_parent (id, tenant_id));
            CREATE UNIQUE INDEX probe_child_one_open ON probe_child (parent_id)
                WHERE ref_id IS NULL;
            CREATE TEMP TABLE probe_global (
                id int PRIMARY KEY, child_id uuid, child_tenant uuid,
                CONSTRAINT probe_global_child_fk FOREIGN KEY (child_tenant, child_id)
                    REFERENCES probe_child (tenant_id, id));
            """
        )
        cursor.execute(
            "SELECT nspname FROM pg_namespace WHERE oid = pg_my_temp_schema()"
        )
        (schema,) = cursor.fetchone()
        found = distribution_blockers(cursor, schema)
        assert found == {
            B("probe_parent", _PK, "probe_parent_pkey", "(id)"),
            B("probe_parent", _UNIQUE, "probe_parent_code_key", "(code)"),
            B("probe_child", _FK_OFF, "probe_child_parent_fk",
              "(parent_id) -> probe_parent (id)"),
            B("probe_child", _UNIQUE_INDEX, "probe_child_one_open", "(parent_id)"),
            B("probe_global", _FK_INTO, "probe_global_child_fk",
              "(child_tenant, child_id) -> probe_child (tenant_id, id)"),
        }  # fmt: skip
        # Listed as known: the comparison is clean.
        known = frozenset(found)
        assert drift(found, known) == []
        # A new blocker fails it.
        cursor.execute(
            "ALTER TABLE probe_child ADD CONSTRAINT probe_child_code UNIQUE (id)"
        )
        after_new = distribution_blockers(cursor, schema)
        assert drift(after_new, known) == [
            "new, not in the list: "
            + str(B("probe_child", _UNIQUE, "probe_child_code", "(id)"))
        ]
        # A fixed one still listed fails it too.
        cursor.execute(
            """
            ALTER TABLE probe_child DROP CONSTRAINT probe_child_code;
            ALTER TABLE probe_parent DROP CONSTRAINT probe_parent_pkey CASCADE;
            ALTER TABLE probe_parent ADD PRIMARY KEY (tenant_id, id);
            """
        )
        after_fix = distribution_blockers(cursor, schema)
        assert drift(after_fix, known) == [
            "fixed, delete from the list: "
            + str(B("probe_child", _FK_OFF, "probe_child_parent_fk",
                    "(parent_id) -> probe_parent (id)")),
            "fixed, delete from the list: "
            + str(B("probe_parent", _PK, "probe_parent_pkey", "(id)")),
        ]  # fmt: skip
