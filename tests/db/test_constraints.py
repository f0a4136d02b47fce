"""Invariants 2, 3, 5, 7 and 8, each attacked with raw SQL around the ORM."""

from __future__ import annotations

import importlib
import json
import re

import pytest
from django.conf import settings
from django.db import connection, transaction

from audit import services as audit_services
from audit.models import EVENT_CODE_CHECK, EVENT_CODE_DOMAIN, Event, EventCode
from portal.actors import Actor
from portal.codes import REASON_CODE_CHECK, REASON_CODE_DOMAIN, ReasonCode
from tasks.models import Contract, ContractStatus, OperationState, TaskState
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
        ("tasks_task", "state", "tasks_task_state_check"),
        ("tasks_task", "reason_code", REASON_CODE_CHECK),
        ("tasks_operation", "state", "tasks_operation_state_check"),
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
        ("actor_type", "audit_event_actor_type_check"),
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
        ("tasks_task_state_check", TaskState.values),
        ("tasks_operation_state_check", OperationState.values),
        (EVENT_CODE_CHECK, EventCode.values),
        (REASON_CODE_CHECK, ReasonCode.values),
    ],
)
def test_database_enums_equal_the_python_enums(constraint, values):
    """The CHECK constraints hold exactly the values the code declares (R17 copies).

    An enum with a value its domain lacks fails here: portal/domains.py says how to
    add one."""
    assert _check_values(constraint) == set(values)


@pytest.mark.parametrize(
    ("table", "column", "domain"),
    [
        ("audit_event", "code", EVENT_CODE_DOMAIN),
        ("audit_event", "reason_code", REASON_CODE_DOMAIN),
        ("tasks_task", "reason_code", REASON_CODE_DOMAIN),
        ("tasks_operation", "reason_code", REASON_CODE_DOMAIN),
        ("tasks_escalation", "reason_code", REASON_CODE_DOMAIN),
    ],
)
def test_value_lists_are_checked_by_their_domain(table, column, domain):
    """Each listed column's type is the domain (so every write is checked by it), on
    every partition of the event table too, and no table CHECK repeats the list."""
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
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass"
            " AND contype = 'c' AND pg_get_constraintdef(oid) LIKE %s",
            [table, f"%{column}%ANY%"],
        )
        repeated = cursor.fetchall()
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
    payload = json.dumps({"blob": "x" * settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES})
    with refused_by("audit_event_payload_size_check"):
        execute(
            """
            INSERT INTO audit_event (id, tenant_id, code, actor_type, actor_id, payload,
                trace_id, span_id)
            VALUES (audit_uuid7_at(now()), %s, 'task.registered', 'system', 'x', %s::jsonb,
                '', '')
            """,
            [tenant.pk, payload],
        )


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
