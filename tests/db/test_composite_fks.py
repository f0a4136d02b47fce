"""Invariant 1: every child row points at its parent by (tenant_id, parent_id).

The schema walk finds every relation between tenant-owned models, so a new model or
foreign key cannot forget its composite key; each relation is then attacked with raw
SQL that points a child into another tenant.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, models, transaction

from audit import services as audit_services
from audit.models import Outbox
from console.models import DeskComment
from limits.models import Budget, LimitUsage, RateLimit
from portal import idempotency
from portal import services as portal_services
from portal.actors import Actor
from portal.models import AgentRequestWindow, Tenant
from tasks.models import (
    Approval,
    ApprovalDecision,
    Contract,
    ContractStatus,
    Credential,
    Escalation,
)
from tests.support.contracts import customer_issue_spec
from tests.support.tenancy import models_with_a_tenant_field

from .conftest import execute, refused_by


def tenant_relations() -> list[tuple[type[models.Model], models.ForeignKey]]:
    """(child model, FK field) for every FK between two tenant-owned models."""
    owned = set(models_with_a_tenant_field())
    return [
        (model, field)
        # In one order in every process (xdist's workers must collect alike).
        for model in sorted(owned, key=lambda model: model._meta.label)
        for field in model._meta.concrete_fields
        if isinstance(field, models.ForeignKey)
        and field.name != "tenant"
        and field.related_model in owned
    ]


def foreign_keys_of(table: str) -> set[tuple[tuple[str, ...], str, tuple[str, ...]]]:
    """(columns, referenced table, referenced columns) of every FK on table."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.conname,
                   ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(n, o)
                         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n
                         ORDER BY k.o),
                   c.confrelid::regclass::text,
                   ARRAY(SELECT a.attname FROM unnest(c.confkey) WITH ORDINALITY k(n, o)
                         JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n
                         ORDER BY k.o)
            FROM pg_constraint c
            WHERE c.contype = 'f' AND c.conrelid = %s::regclass
            """,
            [table],
        )
        return {(tuple(cols), ref, tuple(refcols)) for _, cols, ref, refcols in cursor}


def unique_keys_of(table: str) -> set[tuple[str, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(n, o)
                         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n
                         ORDER BY k.o)
            FROM pg_constraint c
            WHERE c.contype IN ('u', 'p') AND c.conrelid = %s::regclass
            """,
            [table],
        )
        return {tuple(cols) for (cols,) in cursor}


def test_the_walk_finds_the_known_relations():
    """Guards the walker itself: it must see the relations this test was written for."""
    found = {(m._meta.db_table, f.column) for m, f in tenant_relations()}
    assert {
        ("tasks_operation", "task_id"),
        ("tasks_credential", "operation_id"),
        ("portal_agentkey", "agent_id"),
        ("audit_outbox", "event_id"),
    } <= found


@pytest.mark.django_db
@pytest.mark.parametrize(
    "model", models_with_a_tenant_field(), ids=lambda m: m._meta.label
)
def test_every_tenant_owned_table_is_a_composite_key_target(model):
    """Every tenant-owned table has UNIQUE (tenant_id, id) for children to point at."""
    assert ("tenant_id", "id") in unique_keys_of(model._meta.db_table)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("model", "field"),
    tenant_relations(),
    ids=lambda value: (
        getattr(getattr(value, "_meta", None), "label", None)
        or getattr(value, "name", "")
    ),
)
def test_every_tenant_relation_has_its_composite_foreign_key(model, field):
    """A child's FK to a tenant-owned parent includes tenant_id on both sides."""
    expected = (
        ("tenant_id", field.column),
        field.related_model._meta.db_table,
        ("tenant_id", "id"),
    )
    assert expected in foreign_keys_of(model._meta.db_table)


@pytest.mark.django_db
def test_task_pins_its_contract_within_its_tenant():
    """tasks_task (tenant_id, contract_key, contract_version) -> tasks_contract."""
    assert (
        ("tenant_id", "contract_key", "contract_version"),
        "tasks_contract",
        ("tenant_id", "key", "version"),
    ) in foreign_keys_of("tasks_task")


# --- Raw SQL attacks: point a child into another tenant ------------------------------

APPEND_ONLY = frozenset({"console_deskcomment"})

SPEC = customer_issue_spec(fields=[], target="desk")


def _event_in(tenant: Tenant) -> Outbox:
    with transaction.atomic():
        event_id = audit_services.event_append(
            tenant_id=tenant.pk, code="task.registered", actor=Actor.system("test")
        )
    return Outbox.objects.get(event_id=event_id)


def _child_and_foreign_parent(
    relation: str,
    tenant: Tenant,
    other: Tenant,
    make_operation: Callable[..., Any],
    make_task: Callable[..., Any],
) -> tuple[str, Any, Any]:
    """(table, child row in tenant, parent id in other tenant) for one relation."""
    if relation == "tasks_operation.task_id":
        return "tasks_operation", make_operation(), make_task(tenant=other).pk
    if relation == "tasks_credential.operation_id":
        operation = make_operation()
        credential = Credential.objects.create(
            tenant=tenant,
            operation=operation,
            object_type="t",
            object_id="1",
            action="a",
            target="desk",
            secret_hash="0" * 64,
            expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1),
        )
        other_operation = make_operation(task=make_task(tenant=other))
        return "tasks_credential", credential, other_operation.pk
    if relation == "portal_agentkey.agent_id":
        issued = portal_services.agent_key_issue(
            agent=portal_services.agent_create(tenant=tenant, name="a")
        )
        other_agent = portal_services.agent_create(tenant=other, name="b")
        return "portal_agentkey", issued.key, other_agent.pk
    if relation == "portal_agentgrant.agent_id":
        agent = portal_services.agent_create(tenant=tenant, name="a")
        grant = portal_services.agent_grant(agent=agent, action="x", target="*")
        other_agent = portal_services.agent_create(tenant=other, name="b")
        return "portal_agentgrant", grant, other_agent.pk
    if relation == "portal_idempotentrequest.agent_id":
        agent = portal_services.agent_create(tenant=tenant, name="a")
        record_id = idempotency.idempotent_request_begin(
            agent=agent, key="k", fingerprint="f"
        )
        other_agent = portal_services.agent_create(tenant=other, name="b")
        return "portal_idempotentrequest", SimpleNamespace(pk=record_id), other_agent.pk
    if relation in ("tasks_escalation.task_id", "tasks_escalation.operation_id"):
        operation = make_operation()
        escalation = Escalation.objects.create(
            tenant=tenant,
            task_id=operation.task_id,
            operation=operation,
            reason_code="FIELD_STALE",
        )
        other_operation = make_operation(task=make_task(tenant=other))
        foreign = (
            other_operation.task_id
            if relation.endswith("task_id")
            else other_operation.pk
        )
        return "tasks_escalation", escalation, foreign
    if relation == "tasks_approval.operation_id":
        operation = make_operation()
        user = User.objects.create_user(username=f"approver-{operation.pk}")
        approval = Approval.objects.create(
            tenant=tenant, operation=operation, input_hash="h", approved_by=user
        )
        other_operation = make_operation(task=make_task(tenant=other))
        return "tasks_approval", approval, other_operation.pk
    if relation == "tasks_approvaldecision.approval_id":
        operation = make_operation()
        user = User.objects.create_user(username=f"approver-{operation.pk}")
        approval = Approval.objects.create(
            tenant=tenant, operation=operation, input_hash="h", state="waiting"
        )
        decision = ApprovalDecision.objects.create(
            tenant=tenant,
            approval=approval,
            person=user,
            verdict="approve",
            saw_digest="d",
        )
        other_approval = Approval.objects.create(
            tenant=other,
            operation=make_operation(task=make_task(tenant=other)),
            input_hash="h",
            state="waiting",
        )
        return "tasks_approvaldecision", decision, other_approval.pk
    if relation in ("tasks_operation.agent_id", "tasks_operation.executed_by_agent_id"):
        operation = make_operation()
        other_agent = portal_services.agent_create(tenant=other, name="b")
        return "tasks_operation", operation, other_agent.pk
    if relation == "console_deskcomment.task_id":
        task = make_task(tenant=tenant)
        author = User.objects.create_user(username=f"commenter-{task.pk}")
        comment = DeskComment.objects.create(
            tenant=tenant, task=task, author=author, body="seen"
        )
        return "console_deskcomment", comment, make_task(tenant=other).pk
    if relation == "audit_outbox.event_id":
        outbox = _event_in(tenant)
        return "audit_outbox", outbox, _event_in(other).event_id
    if relation in (
        "limits_ratelimit.agent_id",
        "limits_budget.agent_id",
        "portal_agentrequestwindow.agent_id",
        "limits_limitusage.rate_limit_id",
        "limits_limitusage.budget_id",
    ):
        return _limits_child(relation, tenant, other)
    raise AssertionError(f"no attack written for {relation}: add one")


def _limits_child(relation: str, tenant: Tenant, other: Tenant) -> tuple[str, Any, Any]:
    """The kill switch's and the limits' rows (limits/, docs/limits.md)."""
    agent = portal_services.agent_create(tenant=tenant, name="limited")
    other_agent = portal_services.agent_create(tenant=other, name="b")
    if relation == "portal_agentrequestwindow.agent_id":
        window = AgentRequestWindow.objects.create(
            tenant=tenant, agent=agent, window_start=dt.datetime.now(dt.UTC), requests=1
        )
        return "portal_agentrequestwindow", window, other_agent.pk
    if relation == "limits_ratelimit.agent_id":
        limit = RateLimit.objects.create(
            tenant=tenant, agent=agent, action="a", max_calls=1
        )
        return "limits_ratelimit", limit, other_agent.pk
    budget = Budget.objects.create(
        tenant=tenant, agent=agent, action="a", argument="amount", max_total=10
    )
    if relation == "limits_budget.agent_id":
        return "limits_budget", budget, other_agent.pk
    now = dt.datetime.now(dt.UTC)
    if relation == "limits_limitusage.budget_id":
        usage = LimitUsage.objects.create(
            tenant=tenant, budget=budget, window_start=now, used=0, allowed=10
        )
        other_budget = Budget.objects.create(
            tenant=other, agent=other_agent, action="a", argument="x", max_total=1
        )
        return "limits_limitusage", usage, other_budget.pk
    limit = RateLimit.objects.create(
        tenant=tenant, agent=agent, action="a", max_calls=1
    )
    usage = LimitUsage.objects.create(
        tenant=tenant, rate_limit=limit, window_start=now, used=0, allowed=1
    )
    other_limit = RateLimit.objects.create(
        tenant=other, agent=other_agent, action="a", max_calls=1
    )
    return "limits_limitusage", usage, other_limit.pk


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "relation",
    sorted(f"{m._meta.db_table}.{f.column}" for m, f in tenant_relations()),
)
def test_raw_sql_cannot_point_a_child_into_another_tenant(
    relation, tenant, other_tenant, make_operation, make_task
):
    """UPDATE child SET parent_id = <other tenant's parent> is refused by the database."""
    table, child, foreign_parent = _child_and_foreign_parent(
        relation, tenant, other_tenant, make_operation, make_task
    )
    column = relation.split(".")[1]
    # An append-only table takes no UPDATE at all: a copy of the row pointing into
    # the other tenant is the attack there.
    statement = (
        f"INSERT INTO {table} (id, tenant_id, task_id, author_id, body, created_at)"
        f" SELECT gen_random_uuid(), tenant_id, %s, author_id, body, now()"
        f" FROM {table} WHERE id = %s"
        if table in APPEND_ONLY
        else f"UPDATE {table} SET {column} = %s WHERE id = %s"
    )
    params = [foreign_parent, child.pk]
    if relation == "audit_outbox.event_id":
        # The outbox's key must equal its event id (audit_outbox_key_is_event_check):
        # move both, so the only wall left to meet is the tenant foreign key.
        statement = f"UPDATE {table} SET event_id = %s, key = %s::varchar WHERE id = %s"
        params = [foreign_parent, foreign_parent, child.pk]
    with refused_by(f"{table}_{column.removesuffix('_id')}_same_tenant_fk"):
        execute(statement, params)


@pytest.mark.django_db
def test_raw_insert_of_an_operation_under_another_tenants_task_is_refused(
    tenant, other_tenant, make_task
):
    """INSERT with tenant A and task of tenant B: the composite FK refuses it."""
    foreign_task = make_task(tenant=other_tenant)
    with refused_by("tasks_operation_task_same_tenant_fk"):
        execute(
            """
            INSERT INTO tasks_operation (id, tenant_id, task_id, idempotency_key, action,
                target, input_hash, input, state, state_version, attempts, trace_id,
                span_id)
            VALUES (gen_random_uuid(), %s, %s, 'k', 'a', 't', 'h', '{}', 'reserved', 1,
                0, '', '')
            """,
            [tenant.pk, foreign_task.pk],
        )


@pytest.mark.django_db
def test_raw_sql_cannot_pin_another_tenants_contract(tenant, other_tenant, make_task):
    """A task may pin only a contract version of its own tenant."""
    Contract.objects.create(
        tenant=other_tenant,
        key="c",
        version=1,
        spec=SPEC,
        status=ContractStatus.PUBLISHED,
    )
    task = make_task()
    with refused_by("tasks_task_contract_same_tenant_fk"):
        execute(
            "UPDATE tasks_task SET contract_key = 'c', contract_version = 1 WHERE id = %s",
            [task.pk],
        )
