"""The app role can no longer erase a live tenant's trail (issue 19 §1).

The finding, as it was reproduced on main: as ``portal_app``, set the tenant's
``events_on_delete`` to ``purge``, delete its tasks, call the purge function on
``audit_event`` and ``audit_checkpoint``, set the policy back; the events and
checkpoints were gone, the tenant still live, and ``verify_audit`` said intact.
Here each step is replayed over a raw connection as the app role and refused (or,
for the tasks, allowed but harmless to the trail); the trail is unchanged and
verifies. The second wall: a superuser who erases the trail with triggers off is
reported by ``verify_audit`` (the chains' head rows outlive the events). The
legitimate path, ``manage.py delete_tenant`` as the operator, still purges.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import transaction

from audit import services as audit_services
from audit.models import ChainHead, Checkpoint, Event, EventCode
from portal.actors import Actor
from portal.models import EventsOnDelete, Tenant
from tasks.models import Task
from tests.support.db import connect_as

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = Actor.system("erasure-test")


def verify(tenant: Tenant) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", tenant=tenant.slug, stdout=out, stderr=out)
    except SystemExit as stop:
        return int(stop.code or 0), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def acme(make_tenant: Callable[..., Tenant], make_task: Callable[..., Task]) -> Tenant:
    """A live tenant with three tasks, their events and the tenant's, checkpointed."""
    acme = make_tenant(slug="acme", events_on_delete=EventsOnDelete.KEEP)
    for task in [make_task(tenant=acme) for _ in range(3)]:
        for n in range(4):
            with transaction.atomic():
                audit_services.event_append(
                    tenant_id=acme.pk,
                    task_id=task.pk,
                    code=EventCode.TASK_TRANSITIONED,
                    actor=ACTOR,
                    data={"n": n},
                )
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=acme.pk, code=EventCode.TENANT_CHANGED, actor=ACTOR, data={}
        )
    call_command("checkpoint_audit", stdout=io.StringIO())
    return acme


def trail_of(tenant: Tenant) -> dict[str, Any]:
    return {
        "events": sorted(Event.objects.filter(tenant=tenant).values_list("id", "hash")),
        "checkpoints": Checkpoint.objects.filter(tenant=tenant).count(),
        "heads": ChainHead.objects.filter(tenant=tenant).count(),
        "policy": Tenant.objects.get(pk=tenant.pk).events_on_delete,
    }


def refused(conn: psycopg.Connection, sql: str, params: list[Any]) -> str:
    """Run ``sql`` in its own transaction; the SQLSTATE it was refused with."""
    with pytest.raises(psycopg.Error) as caught, conn.transaction():
        conn.execute(sql, params)
    assert caught.value.sqlstate is not None
    return caught.value.sqlstate


def test_the_erasure_sequence_is_refused_step_by_step(acme: Tenant):
    # given a live tenant's checkpointed trail that verifies
    before = trail_of(acme)
    assert len(before["events"]) == 13 and before["checkpoints"] == 4
    assert verify(acme)[0] == 0
    with connect_as("app", autocommit=True) as app:
        app.execute(  # a session scope, as a request's would be
            "SELECT set_config('portal.tenant_ids', %s, false)", [str(acme.pk)]
        )
        # when the app role replays the sequence, each step on its own
        # 1. the policy to purge: no UPDATE on that column (or on deleted_at)
        policy = "UPDATE portal_tenant SET events_on_delete = 'purge' WHERE id = %s"
        assert refused(app, policy, [acme.pk]) == "42501"
        tombstone = "UPDATE portal_tenant SET deleted_at = now() WHERE id = %s"
        assert refused(app, tombstone, [acme.pk]) == "42501"
        # 2. its tasks deleted: allowed (the app role runs tasks), not the trail
        app.execute("DELETE FROM tasks_task WHERE tenant_id = %s", [acme.pk])
        # 3. the purge, old and new: gone, and not the app role's
        for table in ("audit_event", "audit_checkpoint"):
            old = "SELECT tasks_purge_tenant_rows(%s::regclass, %s)"
            assert refused(app, old, [table, acme.pk]) == "42883"  # no such function
        new = "SELECT * FROM tenant_deletion_purge(%s)"
        assert refused(app, new, [acme.pk]) == "42501"
        # ... nor any other way to the trail or what vouches for it
        for table in (
            "audit_event",
            "audit_checkpoint",
            "audit_chainhead",
            "audit_retentionpurge",
            "audit_retentionanchor",
        ):
            delete = f"DELETE FROM {table} WHERE tenant_id = %s"
            assert refused(app, delete, [acme.pk]) == "42501", table
        # ... and the shortest retention (a tenant admin's right) keeps this month
        # (retention runs in every tenant's scope, docs/database-roles.md)
        app.execute(
            "SELECT set_config('portal.tenant_ids',"
            " (SELECT string_agg(id::text, ',') FROM portal_tenant), false)"
        )
        app.execute(
            "INSERT INTO audit_retentionpolicy (tenant_id, event_months, payload_days)"
            " VALUES (%s, 1, 1)",
            [acme.pk],
        )
        row = app.execute(
            "SELECT events, deleted FROM audit_retention_purge(%s, %s, 1)",
            [acme.pk, uuid.uuid4()],
        ).fetchone()
        assert row == (0, 0)
        # 4. the policy back: refused like step 1
        back = "UPDATE portal_tenant SET events_on_delete = 'keep' WHERE id = %s"
        assert refused(app, back, [acme.pk]) == "42501"
    # then the trail is as it was, the tenant live, and it verifies
    assert trail_of(acme) == before
    assert Tenant.objects.get(pk=acme.pk).deleted_at is None
    code, output = verify(acme)
    assert code == 0, output
    assert "ok tenant acme: 13 events" in output


def test_a_tenant_created_to_purge_is_not_purged_by_the_app_role(
    make_tenant: Callable[..., Tenant],
):
    """A policy chosen at creation (an INSERT, still the app role's) opens nothing."""
    globex = make_tenant(slug="globex", events_on_delete=EventsOnDelete.PURGE)
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=globex.pk, code=EventCode.TENANT_CHANGED, actor=ACTOR, data={}
        )
    with connect_as("app", autocommit=True) as app:
        app.execute(
            "SELECT set_config('portal.tenant_ids', %s, false)", [str(globex.pk)]
        )
        new = "SELECT * FROM tenant_deletion_purge(%s)"
        assert refused(app, new, [globex.pk]) == "42501"
    assert Event.objects.filter(tenant=globex).count() == 1


def test_the_operator_function_refuses_a_live_tenants_trail(acme: Tenant):
    """Even the operator cannot purge a tenant that still has tasks, nor one
    already deleted; only a deletion (children first) reaches the trail."""
    with connect_as("operator") as operator:
        operator.execute(
            "SELECT set_config('portal.tenant_ids', %s, true)", [str(acme.pk)]
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            operator.execute("SELECT * FROM tenant_deletion_purge(%s)", [acme.pk])
        assert "still has tasks" in str(caught.value)
    assert verify(acme)[0] == 0


def test_a_superusers_erasure_with_triggers_off_is_reported(acme: Tenant):
    # given the erasure done by the database's superuser, triggers off
    with connect_as("admin") as admin, admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        for table in ("audit_outbox", "audit_event", "audit_checkpoint"):
            admin.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [acme.pk])
    assert not Event.objects.filter(tenant=acme).exists()
    # when verify_audit runs, then it names the kind: the head rows outlived them
    code, output = verify(acme)
    assert code == 1, output
    assert output.startswith("BROKEN tenant acme: deleted: chain ")
    assert "no events left, its head row says #" in output


def test_a_tail_cut_before_any_checkpoint_is_reported_by_the_head_row(acme: Tenant):
    task_id = Event.objects.filter(tenant=acme).exclude(task_id=None)[0].task_id
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=acme.pk, task_id=task_id, code=EventCode.TASK_TRANSITIONED,
            actor=ACTOR, data={"n": 99},
        )  # fmt: skip
    newest = Event.objects.filter(task_id=task_id).order_by("-chain_seq")[0]
    with connect_as("admin") as admin, admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute("DELETE FROM audit_outbox WHERE event_id = %s", [newest.pk])
        admin.execute("DELETE FROM audit_event WHERE id = %s", [newest.pk])
    code, output = verify(acme)
    assert code == 1, output
    assert "deleted" in output and "ends at #4, its head row says #5" in output


@pytest.mark.parametrize("policy", EventsOnDelete.values)
def test_delete_tenant_as_the_operator_still_purges_or_keeps(acme: Tenant, policy: str):
    # given the operator chose the policy (the app role cannot)
    with connect_as("operator", autocommit=True) as operator:
        operator.execute(
            "UPDATE portal_tenant SET events_on_delete = %s WHERE id = %s",
            [policy, acme.pk],
        )
    # when the operator's command deletes the tenant
    call_command("delete_tenant", "acme", "--yes", stdout=io.StringIO())
    # then purge removes the trail with the tenant; keep leaves a tombstone
    if policy == EventsOnDelete.PURGE:
        assert not Tenant.objects.filter(pk=acme.pk).exists()
        assert not Event.objects.filter(tenant_id=acme.pk).exists()
        assert not ChainHead.objects.filter(tenant_id=acme.pk).exists()
    else:
        assert Tenant.objects.get(pk=acme.pk).deleted_at is not None
        assert Event.objects.filter(tenant_id=acme.pk).count() == 14
        assert verify(acme)[0] == 0
