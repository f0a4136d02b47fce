"""``manage.py load_scale_data``: a small load keeps every database invariant.

The load goes through COPY with triggers and foreign keys in force; these tests read
the result back with raw SQL, as docs/style.md R17 asks, rather than trusting the
loader.
"""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import ProgrammingError, connection, transaction

from config.scale_data import loading, stories
from portal import scope
from portal.models import Tenant, TenantPerm
from tasks.hashing import input_hash
from tasks.models import Operation, Task

TASKS = 2000
EVENTS = 20_000
TENANTS = 3


def _one(sql: str, params: list[Any] | None = None) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def _rows(sql: str) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall())


@pytest.fixture
def loaded(transactional_db: None) -> tuple[str, str]:
    """A small load through the command, as a person runs it (COPY thread and all)."""
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "load_scale_data",
        tasks=TASKS,
        events=EVENTS,
        tenants=TENANTS,
        chunk=500,
        stdout=out,
        stderr=err,
    )
    return out.getvalue(), err.getvalue()


def test_small_load_keeps_every_invariant(loaded: tuple[str, str]) -> None:
    # given a load of 2,000 tasks and 20,000 events over three tenants
    stdout, stderr = loaded

    # then the totals are exactly the ones asked for
    assert _one("SELECT count(*) FROM tasks_task") == TASKS
    assert _one("SELECT count(*) FROM audit_event") == EVENTS
    # and every event of a task is in that task's tenant and carries its trace id
    assert (
        _one(
            """
            SELECT count(*) FROM audit_event e
            LEFT JOIN tasks_task t ON t.id = e.task_id AND t.tenant_id = e.tenant_id
            WHERE e.task_id IS NOT NULL
              AND (t.id IS NULL OR t.trace_id <> e.trace_id)
            """
        )
        == 0
    )
    # and every event of an operation names that operation's task and tenant
    assert (
        _one(
            """
            SELECT count(*) FROM audit_event e
            LEFT JOIN tasks_operation o
              ON o.id = e.operation_id AND o.tenant_id = e.tenant_id
             AND o.task_id = e.task_id
            WHERE e.operation_id IS NOT NULL AND o.id IS NULL
            """
        )
        == 0
    )
    # and each task has 5-15 events
    low, high = _rows(
        """
        SELECT min(n), max(n) FROM (
            SELECT count(*) AS n FROM audit_event
            WHERE task_id IS NOT NULL GROUP BY task_id
        ) AS per_task
        """
    )[0]
    assert (low, high) == (5, 15)
    # and outbox rows belong to published events of their own tenant, one each
    assert (
        _one(
            """
            SELECT count(*) FROM audit_outbox o
            LEFT JOIN audit_event e ON e.id = o.event_id AND e.tenant_id = o.tenant_id
            WHERE e.id IS NULL OR e.code = 'gateway.checked'
               OR o.key <> e.id::text OR o.payload->>'trace_id' <> e.trace_id
            """
        )
        == 0
    )
    # and the gateway's events have the shape it writes now: one gateway.checked per
    # check pass listing its checks (a refusal last), no credential.issued, and each
    # call's credentials in its operation.executing event, with their rows
    assert (
        _one("SELECT count(*) FROM audit_event WHERE code = 'credential.issued'") == 0
    )
    assert (
        _one(
            """
            SELECT count(*) FROM audit_event
            WHERE code = 'gateway.checked' AND NOT (
                jsonb_typeof(payload->'checks') = 'array'
                AND payload->'checks'->-1->>'verdict' = payload->>'verdict'
                AND (payload->>'verdict' = 'passed') = (reason_code IS NULL)
                AND (payload ? 'check') = (payload->>'verdict' = 'refused')
            )
            """
        )
        == 0
    )
    assert _one("SELECT count(*) FROM audit_event WHERE code = 'gateway.checked'") > 0
    executing, credentials_listed = _rows(
        """
        SELECT count(DISTINCT e.id), count(c.id) FROM audit_event e
        CROSS JOIN LATERAL jsonb_array_elements(e.payload->'issued') AS i
        LEFT JOIN tasks_credential c
          ON c.tenant_id = e.tenant_id AND c.id = (i->>'credential_id')::uuid
             AND c.operation_id = e.operation_id
        WHERE e.code = 'operation.executing'
        """
    )[0]
    assert executing > 0
    assert credentials_listed == 2 * executing  # execute and lookup, each a row
    assert _one("SELECT count(*) FROM tasks_credential") == credentials_listed
    # and every task waiting for a person has an open escalation with evidence
    assert (
        _one(
            """
            SELECT count(*) FROM tasks_task t
            WHERE t.state IN ('human_required', 'human_claimed')
              AND NOT EXISTS (
                SELECT 1 FROM tasks_escalation x
                WHERE x.tenant_id = t.tenant_id AND x.task_id = t.id
                  AND x.resolved_at IS NULL AND x.evidence ? 'plan'
              )
            """
        )
        == 0
    )
    # and the state mix is realistic: mostly succeeded, some escalated
    states: dict[str, int] = dict(
        _rows("SELECT state, count(*) FROM tasks_task GROUP BY state")
    )
    assert states["succeeded"] > 0.8 * TASKS
    assert states.get("human_required", 0) + states.get("human_claimed", 0) > 0
    assert {"pending", "waiting", "failed", "cancelled"} <= states.keys()
    # and people, agents and the system all act
    actors = {row[0] for row in _rows("SELECT DISTINCT actor_type FROM audit_event")}
    assert actors == {"agent", "user", "system"}
    # and the stored hashes are the ones the services compute (re-registering a
    # loaded task, or re-reserving its operation, is recognised as the same)
    for task in Task.objects.order_by("?")[:50]:
        details = {
            key: getattr(task, key)
            for key in (
                "client_task_id", "workflow_key", "workflow_version", "contract_key",
                "contract_version", "object_type", "object_id", "object_version",
            )
        }  # fmt: skip
        assert task.registration_hash == input_hash(details)
    for operation in Operation.objects.order_by("?")[:50]:
        assert operation.input_hash == input_hash(operation.input)
    # and every event is linked into its chain: the project's verifier agrees
    verified = io.StringIO()
    call_command("verify_audit", stdout=verified, stderr=io.StringIO())
    assert f"intact: {EVENTS} events" in verified.getvalue()
    # and the reviewer of a tenant holds its reviewer permissions
    tenant = Tenant.objects.get(slug="scale-t01")
    reviewer = get_user_model().objects.get(username="reviewer-t01")
    assert reviewer.has_perm(f"portal.{TenantPerm.VIEW_TRAIL}", tenant)
    assert not reviewer.has_perm(f"portal.{TenantPerm.MANAGE_TENANT}", tenant)
    # and progress was reported with a rate and a time left, to the end
    assert "events/s" in stderr and "ETA" in stderr
    assert "(100.0 %)" in stderr
    assert f"loaded {TASKS:,} tasks" in stdout


def test_loaded_rows_are_still_guarded_by_the_triggers(loaded: object) -> None:
    # given a loaded data set (COPY fires triggers; the loader disables none)
    assert _one("SELECT count(*) FROM pg_trigger WHERE tgenabled = 'D'") == 0
    event_id = _one("SELECT id FROM audit_event LIMIT 1")

    # when an event is changed, then it is refused: the app role holds no UPDATE
    # on events (the trigger behind the privilege: tests/db/test_privileges.py)
    with (
        pytest.raises(ProgrammingError) as caught,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE audit_event SET code = code WHERE id = %s", [event_id])
    assert caught.value.__cause__.sqlstate == "42501"  # type: ignore[union-attr]


def test_a_second_load_is_refused_and_append_adds(loaded: object) -> None:
    # given a database that already holds the asked-for totals
    # when the same load runs again, then it is refused and nothing changes
    with pytest.raises(CommandError, match="already holds"):
        call_command(
            "load_scale_data",
            tasks=TASKS,
            events=EVENTS,
            tenants=TENANTS,
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert _one("SELECT count(*) FROM tasks_task") == TASKS

    # when --append asks for more, then exactly that many are added, in new tasks
    call_command(
        "load_scale_data",
        tasks=100,
        events=1000,
        tenants=TENANTS,
        append=True,
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    assert _one("SELECT count(*) FROM tasks_task") == TASKS + 100
    assert _one("SELECT count(*) FROM audit_event") == EVENTS + 1000
    assert _one("SELECT count(DISTINCT tenant_id) FROM portal_membership") == TENANTS


def test_an_interrupted_load_is_topped_up_under_a_command_s_empty_scope(
    loaded: object,
) -> None:
    # given the scope a command starts with: no tenant (the test's own scope would
    # show the loaded rows; a command's shows none until it asks for every tenant)
    # when the load runs again with larger totals, then it adds only the difference
    with scope.tenant_scope([]):
        call_command(
            "load_scale_data",
            tasks=TASKS + 100,
            events=EVENTS + 1000,
            tenants=TENANTS,
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert _one("SELECT count(*) FROM tasks_task") == TASKS + 100
    assert _one("SELECT count(*) FROM audit_event") == EVENTS + 1000


@pytest.mark.parametrize(
    ("tasks", "events"), [(1000, 5000), (1000, 15000), (997, 9999)]
)
def test_event_counts_add_up_exactly_within_bounds(tasks: int, events: int) -> None:
    rng = random.Random(1)
    counts = []
    remaining = events
    for left in range(tasks, 0, -1):
        count = stories.event_count(
            rng, remaining_events=remaining, remaining_tasks=left
        )
        counts.append(count)
        remaining -= count
    assert sum(counts) == events
    assert min(counts) >= 5 and max(counts) <= 15


def test_impossible_ratio_is_refused(db: None) -> None:
    # 100 events cannot give 100 tasks five events each
    with pytest.raises(CommandError, match="each task gets"):
        loading.load(tasks=100, events=100, tenants=1, writers=0)
