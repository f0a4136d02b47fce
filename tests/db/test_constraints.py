"""Invariants 2, 3, 5, 7 and 8, each attacked with raw SQL around the ORM."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import re

import pytest
from django.conf import settings
from django.db import connection, transaction

from audit import selectors as audit_selectors
from audit import services as audit_services
from audit.models import (
    ACTOR_TYPE_CHECK,
    ACTOR_TYPE_DOMAIN,
    EVENT_CODE_CHECK,
    EVENT_CODE_DOMAIN,
    EVENT_PAYLOAD_CHECK,
    EVENT_PAYLOAD_DOMAIN,
    OUTBOX_STATE_CHECK,
    OUTBOX_STATE_DOMAIN,
    Event,
    EventCode,
    OutboxState,
)
from portal.actors import Actor, ActorType
from portal.codes import REASON_CODE_CHECK, REASON_CODE_DOMAIN, ReasonCode
from portal.ids import new_id
from tasks.models import (
    OPERATION_STATE_CHECK,
    OPERATION_STATE_DOMAIN,
    TASK_STATE_CHECK,
    TASK_STATE_DOMAIN,
    Contract,
    ContractStatus,
    OperationState,
    TaskState,
)
from tests.support.contracts import customer_issue_spec

from .conftest import execute, refused_by, refused_for_privilege

pytestmark = pytest.mark.django_db

audit_migration = importlib.import_module("audit.migrations.0002_invariants")

SPEC = customer_issue_spec(fields=["email"], target="desk")


def _event(tenant, **fields) -> Event:
    with transaction.atomic():
        event_id = audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.TASK_REGISTERED,
            actor=Actor.system("test"),
            **fields,
        )
    return Event.objects.get(pk=event_id)


# --- Invariant 2: one operation per (tenant, idempotency key) -------------------------


def test_a_second_operation_with_the_same_key_is_refused(make_operation):
    operation = make_operation(idempotency_key="ticket-for-issue-42")
    with refused_by("tasks_operation_idempotency_key_uniq"):
        execute(
            """
            INSERT INTO tasks_operation (id, tenant_id, task_id, idempotency_key, action,
                target, input_hash, input, state, state_version, attempts, trace_id,
                span_id)
            SELECT gen_random_uuid(), tenant_id, task_id, idempotency_key, action, target,
                   'another-hash', input, 'reserved', 1, 0, '', ''
            FROM tasks_operation WHERE id = %s
            """,
            [operation.pk],
        )


def test_the_same_key_in_another_tenant_is_a_different_operation(
    make_operation, make_task, other_tenant
):
    make_operation(idempotency_key="shared-key")
    other = make_operation(
        task=make_task(tenant=other_tenant), idempotency_key="shared-key"
    )
    assert other.pk


# --- Invariant 3: states and reason codes are closed enums ----------------------------


@pytest.mark.parametrize(
    ("table", "column", "constraint"),
    [
        ("tasks_task", "state", TASK_STATE_CHECK),
        ("tasks_task", "reason_code", REASON_CODE_CHECK),
        ("tasks_operation", "state", OPERATION_STATE_CHECK),
        ("tasks_operation", "reason_code", REASON_CODE_CHECK),
    ],
)
def test_unknown_states_and_reason_codes_are_refused(
    make_operation, table, column, constraint
):
    """A raw INSERT copying a valid row but with a made-up value is refused."""
    operation = make_operation()
    row_id = operation.task_id if table == "tasks_task" else operation.pk
    with refused_by(constraint):
        execute(
            f"""
            INSERT INTO {table}
            SELECT (jsonb_populate_record(NULL::{table}, to_jsonb(r) || jsonb_build_object(
                'id', gen_random_uuid(), 'client_task_id', 'copy',
                'idempotency_key', 'copy', %s::text, 'MADE_UP'))).*
            FROM {table} AS r WHERE r.id = %s
            """,
            [column, row_id],
        )


@pytest.mark.parametrize(
    ("column", "constraint"),
    [
        ("code", EVENT_CODE_CHECK),
        ("reason_code", REASON_CODE_CHECK),
        ("actor_type", ACTOR_TYPE_CHECK),
    ],
)
def test_unknown_event_codes_are_refused(tenant, column, constraint):
    values = {"code": "task.registered", "reason_code": None, "actor_type": "system"}
    values[column] = "made.up"
    with refused_by(constraint):
        execute(
            """
            INSERT INTO audit_event (id, tenant_id, code, actor_type, actor_id,
                reason_code, payload, trace_id, span_id)
            VALUES (audit_uuid7_at(now()), %s, %s, %s, 'x', %s, '{}', '', '')
            """,
            [tenant.pk, values["code"], values["actor_type"], values["reason_code"]],
        )


def _raw_event(tenant, *, created_at: str = "now()") -> str:
    """An event written by raw SQL, its id a UUIDv7 of now; its id."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO audit_event (id, tenant_id, code, actor_type, actor_id,
                payload, trace_id, span_id, created_at)
            VALUES (audit_uuid7_at(now()), %s, 'task.registered', 'system', 'x', '{{}}',
                '', '', {created_at})
            RETURNING id
            """,
            [tenant.pk],
        )
        return cursor.fetchone()[0]


def _raw_outbox_row(tenant, state: str) -> int:
    """An outbox row for a new raw event (its key the event id, as the outbox's
    key CHECK demands)."""
    event_id = _raw_event(tenant)
    return execute(
        """
        INSERT INTO audit_outbox (id, tenant_id, event_id, topic, key, payload, state,
            attempts, last_error)
        VALUES (gen_random_uuid(), %s, %s, 'portal.events', %s, '{}', %s, 0, '')
        """,
        [tenant.pk, event_id, str(event_id), state],
    )


def test_an_unknown_outbox_state_is_refused(tenant):
    """A raw outbox row with a made-up state is refused; the same row with a known
    state goes in (so the refusal is the state's)."""
    assert _raw_outbox_row(tenant, OutboxState.SENT) == 1
    with refused_by(OUTBOX_STATE_CHECK):
        _raw_outbox_row(tenant, "made_up")


@pytest.mark.parametrize(
    ("offset", "refused"),
    [("0 seconds", False), ("23 hours", False), ("25 hours", True)],
)
@pytest.mark.parametrize("sign", ["+", "-"])
def test_an_event_whose_id_time_is_far_from_its_created_at_is_refused(
    tenant, offset, refused, sign
):
    """audit_event_id_time_check: created_at within a day of the id's UUIDv7 time,
    on each side, checked on every partition (the id routes the row)."""
    assert dt.timedelta(days=1) == audit_selectors.ID_TIME_TOLERANCE
    created_at = f"now() {sign} interval '{offset}'"
    if not refused:
        assert _raw_event(tenant, created_at=created_at)
        return
    with refused_by("audit_event_id_time_check"):
        _raw_event(tenant, created_at=created_at)


def test_the_id_time_check_is_on_every_event_partition():
    """Each partition holds the check (PostgreSQL copies a parent's CHECK to new
    partitions; the migration that changed its form replaced it on all)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, pg_get_constraintdef(k.oid)
            FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
            LEFT JOIN pg_constraint AS k ON k.conrelid = c.oid
                AND k.conname = 'audit_event_id_time_check'
            WHERE i.inhparent = 'audit_event'::regclass
            """
        )
        rows = cursor.fetchall()
    assert rows
    assert {definition for _, definition in rows} == {
        "CHECK (audit_event_id_time_ok(id, created_at, '1 day'::interval))"
    }, rows


def test_the_id_time_check_holds_under_an_empty_search_path():
    """pg_restore loads rows with ``search_path = ''``: the CHECK's function must not
    look a name up there (audit/0034; the restore drill failed on it)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_namespace.nspname FROM pg_proc JOIN pg_namespace"
                       " ON pg_namespace.oid = pronamespace"
                       " WHERE proname = 'audit_event_id_time_ok'")
        (schema,) = cursor.fetchone()
        cursor.execute("SET LOCAL search_path = ''")
        cursor.execute(
            f"SELECT {schema}.audit_event_id_time_ok(%s, now(), interval '1 day'),"
            f" {schema}.audit_event_id_time_ok(%s, now() - interval '2 days',"
            " interval '1 day')",
            [new_id(), new_id()],
        )
        assert cursor.fetchone() == (True, False)


def test_a_verified_operation_needs_a_receipt(make_operation):
    operation = make_operation(state=OperationState.EXECUTING)
    with refused_by("tasks_operation_verified_has_receipt_check"):
        execute(
            "UPDATE tasks_operation SET state = 'verified', "
            "state_version = state_version + 1 WHERE id = %s",
            [operation.pk],
        )


def _check_values(constraint: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s",
            [constraint],
        )
        (definition,) = cursor.fetchone()
    return set(re.findall(r"'([^']+)'::", definition))


@pytest.mark.parametrize(
    ("constraint", "values"),
    [
        (TASK_STATE_CHECK, TaskState.values),
        (OPERATION_STATE_CHECK, OperationState.values),
        (EVENT_CODE_CHECK, EventCode.values),
        (REASON_CODE_CHECK, ReasonCode.values),
        (ACTOR_TYPE_CHECK, ActorType.values),
        (OUTBOX_STATE_CHECK, OutboxState.values),
    ],
)
def test_database_enums_equal_the_python_enums(constraint, values):
    """The CHECK constraints hold exactly the values the code declares (R17 copies).

    An enum with a value its domain lacks fails here: portal/domains.py says how to
    add one."""
    assert _check_values(constraint) == set(values)


@pytest.mark.parametrize(
    ("table", "column", "domain", "values"),
    [
        ("audit_event", "code", EVENT_CODE_DOMAIN, EventCode.values),
        ("audit_event", "reason_code", REASON_CODE_DOMAIN, ReasonCode.values),
        ("audit_event", "actor_type", ACTOR_TYPE_DOMAIN, ActorType.values),
        ("audit_outbox", "state", OUTBOX_STATE_DOMAIN, OutboxState.values),
        ("tasks_task", "state", TASK_STATE_DOMAIN, TaskState.values),
        ("tasks_task", "reason_code", REASON_CODE_DOMAIN, ReasonCode.values),
        ("tasks_operation", "state", OPERATION_STATE_DOMAIN, OperationState.values),
        ("tasks_operation", "reason_code", REASON_CODE_DOMAIN, ReasonCode.values),
        ("tasks_escalation", "reason_code", REASON_CODE_DOMAIN, ReasonCode.values),
    ],
)
def test_value_lists_are_checked_by_their_domain(table, column, domain, values):
    """Each listed column's type is the domain (so every write is checked by it), on
    every partition of the event table too, and no table CHECK repeats the list
    (a CHECK naming a few of the values, such as the operation's "settled" states
    in ``tasks_operation_sealed_open_only_check``, is another rule)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, format_type(a.atttypid, a.atttypmod)
            FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
            WHERE a.attname = %s AND (c.oid = %s::regclass OR c.oid IN (
                SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass))
            """,
            [column, table, table],
        )
        types = dict(cursor.fetchall())
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass"
            " AND contype = 'c' AND pg_get_constraintdef(oid) LIKE %s",
            [table, f"%{column}%ANY%"],
        )
        repeated = [
            name
            for name, definition in cursor.fetchall()
            if set(re.findall(r"'([^']+)'::", definition)) >= set(values)
        ]
    assert table in types
    assert set(types.values()) == {domain}, types
    assert repeated == []


def test_the_payload_bound_copy_equals_the_setting():
    assert (
        audit_migration.EVENT_PAYLOAD_MAX_BYTES
        == settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES
    )


# --- Invariant 5: events are append-only ----------------------------------------------


def test_updating_an_event_is_refused(tenant):
    """The app role holds no UPDATE on events; the trigger is the second wall
    (tests/db/test_privileges.py tries it with the privilege granted)."""
    event = _event(tenant)
    with refused_for_privilege():
        execute(
            "UPDATE audit_event SET actor_id = 'someone-else' WHERE id = %s", [event.pk]
        )


def test_deleting_an_event_is_refused(tenant):
    event = _event(tenant)
    with refused_for_privilege():
        execute("DELETE FROM audit_event WHERE id = %s", [event.pk])
    assert Event.objects.filter(pk=event.pk).exists()


# --- Invariant 7: bounded payloads ----------------------------------------------------


def test_an_oversized_event_payload_is_refused(tenant):
    """A payload whose text is one byte over the bound is refused; at the bound it
    goes in (jsonb's text of ``{"blob": "x…"}`` is the JSON as written here)."""
    bound = settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES
    at_bound = json.dumps({"blob": "x" * (bound - len(json.dumps({"blob": ""})))})
    assert len(at_bound) == bound
    insert = """
        INSERT INTO audit_event (id, tenant_id, code, actor_type, actor_id, payload,
            trace_id, span_id)
        VALUES (audit_uuid7_at(now()), %s, 'task.registered', 'system', 'x', %s::jsonb,
            '', '')
        """
    assert execute(insert, [tenant.pk, at_bound]) == 1
    over = at_bound.replace('"x', '"xx', 1)
    with refused_by(EVENT_PAYLOAD_CHECK):
        execute(insert, [tenant.pk, over])


def test_the_payload_bound_is_checked_by_its_domain():
    """The payload column's type is the domain on the event table and each of its
    partitions, its CHECK holds the setting's bound, and no table CHECK repeats
    it (every statement would parse it again)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, format_type(a.atttypid, a.atttypmod)
            FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
            WHERE a.attname = 'payload' AND (c.oid = 'audit_event'::regclass OR c.oid IN
                (SELECT inhrelid FROM pg_inherits
                 WHERE inhparent = 'audit_event'::regclass))
            """
        )
        types = dict(cursor.fetchall())
        cursor.execute(
            "SELECT contypid::regtype::text, pg_get_constraintdef(oid)"
            " FROM pg_constraint WHERE conname = %s",
            [EVENT_PAYLOAD_CHECK],
        )
        checks = cursor.fetchall()
    assert len(types) > 1 and set(types.values()) == {EVENT_PAYLOAD_DOMAIN}, types
    bound = settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES
    assert checks == [
        (EVENT_PAYLOAD_DOMAIN, f"CHECK ((octet_length((VALUE)::text) <= {bound}))")
    ]


def test_event_append_bounds_and_redacts_before_the_database_sees_it(tenant):
    event = _event(
        tenant,
        data={
            "api_key": "agp_0123456789ab.secret",
            "note": "n" * 50_000,
            "nested": {"password": "hunter2", "ok": 1},
        },
    )
    encoded = json.dumps(event.payload)
    assert "hunter2" not in encoded and "agp_0123456789ab" not in encoded
    assert len(encoded.encode()) <= settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES
    assert event.payload["nested"] == {"password": "[REDACTED]", "ok": 1}


# --- The outbox key is the event id (audit migration 0030) ----------------------------


def test_an_outbox_key_other_than_its_event_id_is_refused(tenant):
    """Consumers dedupe on the key; it is unique because the event id is."""
    event = _event(tenant)
    execute("DELETE FROM audit_outbox WHERE event_id = %s", [event.pk])
    insert = """
        INSERT INTO audit_outbox (id, tenant_id, event_id, topic, key, payload, state,
            attempts, last_error)
        VALUES (gen_random_uuid(), %s, %s, 't', %s, '{}', 'pending', 0, '')
    """
    with refused_by("audit_outbox_key_is_event_check"):
        execute(insert, [tenant.pk, event.pk, "another-key"])
    execute(insert, [tenant.pk, event.pk, str(event.pk)])  # the event id: accepted


# --- Invariant 8: published contract versions are immutable ---------------------------


@pytest.fixture
def published(tenant) -> Contract:
    return Contract.objects.create(
        tenant=tenant,
        key="customer-issue",
        version=1,
        spec=SPEC,
        status=ContractStatus.PUBLISHED,
    )


@pytest.mark.parametrize(
    "assignment",
    [
        "spec = '{}'::jsonb",
        "version = 2",
        "key = 'other'",
        "status = 'draft'",
        "published_at = now()",
    ],
)
def test_a_published_contract_cannot_change(published, assignment):
    with refused_by("tasks_contract_immutable_trg"):
        execute(f"UPDATE tasks_contract SET {assignment} WHERE id = %s", [published.pk])


def test_a_published_contract_cannot_be_deleted(published):
    with refused_by("tasks_contract_immutable_trg"):
        execute("DELETE FROM tasks_contract WHERE id = %s", [published.pk])


def test_a_published_contract_can_be_retired_once(published):
    sql = "UPDATE tasks_contract SET status = %s, retired_at = now() WHERE id = %s"
    assert execute(sql, ["retired", published.pk]) == 1
    with refused_by("tasks_contract_immutable_trg"):
        execute(sql, ["published", published.pk])


def test_a_draft_contract_can_still_change(tenant):
    draft = Contract.objects.create(tenant=tenant, key="k", version=1, spec=SPEC)
    assert (
        execute("UPDATE tasks_contract SET spec = '{}' WHERE id = %s", [draft.pk]) == 1
    )
