"""Approvals in the database: each refusal below is PostgreSQL's own (tasks migration
0021), proved with raw SQL as the app role (the test connection's, tests/conftest.py),
not the service's checks.

Distinct people; decisions never rewritten nor made on a settled approval; the
quorum before ``approved``; the sponsor kept out; what an approval is bound to never
changes; consumed once (two connections racing: one row), and consumed is final.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.models import User

from portal.models import Agent
from tasks.models import Approval, ApprovalDecision
from tests.db.conftest import execute, refused_by
from tests.support.db import connect_as

pytestmark = pytest.mark.django_db

GUARD = "tasks_approval_guard_trg"
DECISIONS = "tasks_approvaldecision_guard_trg"


@pytest.fixture
def approval(tenant, make_operation) -> Approval:
    return Approval.objects.create(
        tenant=tenant,
        operation=make_operation(),
        input_hash="a" * 64,
        field_digest="f" * 64,
        groups=["finance"],
        quorum=2,
        state="waiting",
    )


def person(name: str) -> User:
    return User.objects.create_user(name, password="pw-for-tests-only-1")


def decide(approval: Approval, user: User, verdict: str = "approve") -> None:
    execute(
        "INSERT INTO tasks_approvaldecision (id, tenant_id, approval_id, person_id,"
        " verdict, reason, decided_at, saw, saw_digest)"
        " VALUES (gen_random_uuid(), %s, %s, %s, %s, %s, now(), '{}', 'd')",
        [
            approval.tenant_id,
            approval.pk,
            user.pk,
            verdict,
            "why" if verdict == "reject" else "",
        ],
    )


def test_one_decision_per_person(approval):
    ana = person("ana")
    decide(approval, ana)
    with refused_by("tasks_approvaldecision_once_uniq"):
        decide(approval, ana)


def test_decisions_are_never_rewritten(approval):
    decide(approval, person("ana"))
    with refused_by(DECISIONS):
        execute("UPDATE tasks_approvaldecision SET verdict = 'reject', reason = 'x'")
    with refused_by(DECISIONS):  # nor withdrawn while the approval is open
        execute("DELETE FROM tasks_approvaldecision")


def test_a_rejection_needs_a_reason(approval):
    with refused_by("tasks_approvaldecision_reject_reason"):
        execute(
            "INSERT INTO tasks_approvaldecision (id, tenant_id, approval_id,"
            " person_id, verdict, reason, decided_at, saw, saw_digest)"
            " VALUES (gen_random_uuid(), %s, %s, %s, 'reject', '', now(), '{}', 'd')",
            [approval.tenant_id, approval.pk, person("ana").pk],
        )


def test_no_approved_before_the_quorum(approval):
    decide(approval, person("ana"))
    approve = "UPDATE tasks_approval SET state = 'approved' WHERE id = %s"
    with refused_by(GUARD):  # one of two
        execute(approve, [approval.pk])
    decide(approval, person("ben"))
    assert execute(approve, [approval.pk]) == 1


def test_no_decision_on_a_settled_approval(approval):
    decide(approval, person("ana"), "reject")
    execute("UPDATE tasks_approval SET state = 'rejected' WHERE id = %s", [approval.pk])
    with refused_by(DECISIONS):
        decide(approval, person("ben"))


def test_the_sponsor_cannot_decide_where_the_approval_excludes_them(
    tenant, make_operation
):
    sponsor = person("sponsor")
    agent = Agent.objects.create(tenant=tenant, name="refunds", sponsor=sponsor)
    operation = make_operation(agent=agent)
    excluded = Approval.objects.create(
        tenant=tenant,
        operation=operation,
        input_hash="a" * 64,
        quorum=2,
        state="waiting",
        sponsor_excluded=True,
    )
    with refused_by(DECISIONS):
        decide(excluded, sponsor)
    decide(excluded, person("ana"))  # anyone else may


def test_a_new_approval_waits(tenant, make_operation):
    with refused_by(GUARD):  # approved at birth with a quorum of two
        execute(
            "INSERT INTO tasks_approval (id, tenant_id, operation_id, input_hash,"
            " field_digest, groups, quorum, sponsor_excluded, asked, state,"
            " requested_at) VALUES (gen_random_uuid(), %s, %s, 'h', '', '[]', 2,"
            " false, '{}', 'approved', now())",
            [tenant.pk, make_operation().pk],
        )


@pytest.mark.parametrize(
    "assignment",
    [
        "input_hash = 'b'",
        "field_digest = 'b'",
        "quorum = 1",
        "groups = '[]'",
        "sponsor_excluded = true",
        "asked = '{\"x\": 1}'",
    ],
)
def test_what_an_approval_is_bound_to_never_changes(approval, assignment):
    with refused_by(GUARD):
        execute(f"UPDATE tasks_approval SET {assignment} WHERE id = %s", [approval.pk])


def test_consumed_is_final_and_expired_is_not_rejected(approval):
    decide(approval, person("ana"))
    decide(approval, person("ben"))
    execute("UPDATE tasks_approval SET state = 'approved' WHERE id = %s", [approval.pk])
    consume = (
        "UPDATE tasks_approval SET state = 'consumed', used_at = now()"
        " WHERE id = %s AND state = 'approved'"
    )
    assert execute(consume, [approval.pk]) == 1
    assert execute(consume, [approval.pk]) == 0  # the conditional UPDATE: once
    for move in ("approved", "expired", "waiting", "rejected"):
        with refused_by(GUARD):
            execute(
                "UPDATE tasks_approval SET state = %s, used_at = NULL WHERE id = %s",
                [move, approval.pk],
            )
    with refused_by("tasks_approval_used_iff_consumed"):
        execute("UPDATE tasks_approval SET used_at = NULL WHERE id = %s", [approval.pk])


def test_an_open_approval_is_not_deleted(approval):
    with refused_by(GUARD):
        execute("DELETE FROM tasks_approval WHERE id = %s", [approval.pk])


@pytest.mark.django_db(transaction=True)
def test_two_connections_consume_it_once(tenant, make_operation):
    """Two executions race for one approved approval on real parallel connections:
    exactly one UPDATE takes it."""
    operation = make_operation()
    approval = Approval.objects.create(
        tenant=tenant,
        operation=operation,
        input_hash="a" * 64,
        state="approved",
        quorum=1,
        approved_by=person("ana"),
    )
    assert not ApprovalDecision.objects.exists()
    barrier = threading.Barrier(2)
    rows: list[int] = []

    def consume() -> None:
        with connect_as("app") as conn, conn.transaction():
            conn.execute(
                "SELECT set_config('portal.tenant_ids', %s, true)", [str(tenant.pk)]
            )
            barrier.wait()
            cursor: Any = conn.execute(
                "UPDATE tasks_approval SET state = 'consumed', used_at = now()"
                " WHERE id = %s AND state = 'approved'",
                [approval.pk],
            )
            rows.append(cursor.rowcount)

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(rows) == [0, 1]
    approval.refresh_from_db()
    assert approval.state == "consumed"
