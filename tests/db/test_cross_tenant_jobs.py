"""Work that spans tenants still serves every tenant under row-level security.

Each job runs as it does in production: from no scope at all (a Celery job starts
with none, ``config.celery.ScopedTask``). It learns which tenants have work from a
discovery function and works in exactly those (docs/database-roles.md, "Work across
tenants"), so two tenants' work goes in one run.
"""

from __future__ import annotations

import datetime as dt
import io
import uuid

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from audit import services as audit_services
from audit.models import Checkpoint, Event, EventCode
from portal import idempotency, scope
from portal.actors import Actor
from portal.models import IdempotentRequest
from tasks import gateway, jobs
from tasks.models import OperationState, Task, TaskState


def _lapse(*tasks: Task) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_task SET lease_expires_at = app_now() - interval '1 s'"
            " WHERE id = ANY(%s)",
            [[task.pk for task in tasks]],
        )


@pytest.mark.django_db
def test_the_reaper_takes_back_two_tenants_lapsed_leases_in_one_run(
    tenant, other_tenant, make_task
):
    a = make_task(tenant=tenant, state=TaskState.RUNNING, leased=True)
    b = make_task(tenant=other_tenant, state=TaskState.RUNNING, leased=True)
    _lapse(a, b)
    with scope.unit_of_work():
        assert jobs.reap_leases_job() == 2
        assert scope.current() is None
    assert set(
        Task.objects.filter(pk__in=[a.pk, b.pk]).values_list("state", flat=True)
    ) == {"pending"}
    assert Event.objects.filter(code=EventCode.TASK_LEASE_EXPIRED).count() == 2


@pytest.mark.django_db
def test_waking_serves_two_tenants_in_one_run(tenant, other_tenant, make_task):
    due = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    a = make_task(tenant=tenant, state=TaskState.WAITING, wake_at=due)
    b = make_task(tenant=other_tenant, state=TaskState.WAITING, wake_at=due)
    with scope.unit_of_work():
        assert jobs.wake_tasks_job() == 2
    states = Task.objects.filter(pk__in=[a.pk, b.pk]).values_list("state", flat=True)
    assert set(states) == {"pending"}


@pytest.mark.django_db
def test_the_receipt_check_finds_two_tenants_due_operations(
    tenant, other_tenant, make_task, make_operation
):
    past = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    due = [
        make_operation(
            task=make_task(tenant=owner, state=TaskState.RUNNING, leased=True),
            state=OperationState.EXECUTING,
            next_check_at=past,
        )
        for owner in (tenant, other_tenant)
    ]
    with scope.unit_of_work():
        found = gateway.unscoped_operations_due()
        assert scope.current() is None
    assert {(t, o) for t, o, _ in found} == {(op.tenant_id, op.pk) for op in due}


@pytest.mark.django_db
def test_the_idempotency_purge_serves_two_tenants(tenant, other_tenant, make_agent):
    past = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    for owner in (tenant, other_tenant):
        IdempotentRequest.objects.create(
            tenant=owner,
            agent=make_agent(tenant=owner),
            key=f"k-{uuid.uuid4()}",
            fingerprint="0" * 64,
            state="completed",
            locked_until=past,
            expires_at=past,
        )
    with scope.unit_of_work():
        assert idempotency.idempotent_requests_purge_expired() == 2
    assert not IdempotentRequest.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_checkpoint_and_verify_serve_two_tenants_in_one_run(tenant, other_tenant):
    for owner in (tenant, other_tenant):
        with transaction.atomic():
            audit_services.event_append(
                tenant_id=owner.pk,
                code=EventCode.TENANT_CHANGED,
                actor=Actor.system("rls-test"),
                data={"n": 1},
            )
    with scope.unit_of_work():
        out = io.StringIO()
        call_command("checkpoint_audit", stdout=out)
        assert out.getvalue().startswith("signed 2 chain heads in 2 tenants")
        out = io.StringIO()
        call_command("verify_audit", stdout=out)
        assert f"ok tenant {tenant.slug}: 1 events" in out.getvalue()
        assert f"ok tenant {other_tenant.slug}: 1 events" in out.getvalue()
        assert "intact: 2 events" in out.getvalue()
    assert set(Checkpoint.objects.values_list("tenant_id", flat=True)) == {
        tenant.pk,
        other_tenant.pk,
    }
