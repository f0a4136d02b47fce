"""Task registration, transitions and leases: every refusal path, on real PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.models.functions import Now

from audit.models import Event, EventCode, Outbox
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.exceptions import (
    AgentFrozen,
    IllegalTransition,
    LeaseExpired,
    StaleState,
    TenantFrozen,
    ValidationFailed,
)
from tasks import services
from tasks.exceptions import (
    ContractNotFound,
    ContractRetired,
    LeaseHeld,
    TaskIdReused,
    TaskNotFound,
    TaskNotLeasable,
)
from tasks.models import Task, TaskState
from tests.support.contracts import customer_issue_spec

pytestmark = pytest.mark.django_db

SPEC = customer_issue_spec(fields=["email"], target="desk")


def register(tenant, actor, **overrides):
    details = {
        "client_task_id": "issue-42",
        "workflow_key": "customer-issue",
        "workflow_version": "3",
        "object_type": "customer_issue",
        "object_id": "42",
        "object_version": "7",
    }
    return services.task_register(
        tenant=tenant, actor=actor, **{**details, **overrides}
    )


def expire_lease(task: Task) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_task SET lease_expires_at = app_now() - interval '1 second' "
            "WHERE id = %s",
            [task.pk],
        )


def events_of(task: Task) -> list[str]:
    return list(
        Event.objects.filter(task_id=task.pk)
        .order_by("id")
        .values_list("code", flat=True)
    )


# --- Registration ---------------------------------------------------------------------


def test_registration_pins_versions_and_records_one_event(tenant, actor):
    registration = register(tenant, actor)
    task = registration.task
    assert registration.created
    assert (task.state, task.state_version, task.lease_token) == ("pending", 1, 0)
    assert (task.workflow_version, task.object_version) == ("3", "7")
    assert events_of(task) == [EventCode.TASK_REGISTERED]
    assert Outbox.objects.filter(event__task_id=task.pk).count() == 1


def test_registration_with_a_claim_owner_claims_the_new_task_at_once(tenant, actor):
    task = register(tenant, actor, claim_owner="w1", claim_ttl_s=30).task
    stored = Task.objects.get(pk=task.pk)
    for seen in (task, stored):
        assert (seen.state, seen.state_version, seen.lease_token) == ("running", 2, 1)
        assert seen.lease_owner == "w1"
    assert stored.lease_expires_at - stored.lease_acquired_at == dt.timedelta(
        seconds=30
    )
    assert events_of(task) == [EventCode.TASK_REGISTERED, EventCode.TASK_CLAIMED]
    assert Outbox.objects.filter(event__task_id=task.pk).count() == 2
    # Nothing else is claimed, and the lease is a real one: the next claim finds none.
    assert services.task_claim_next(tenant=tenant, owner="w2", actor=actor) is None


def test_a_repeated_registration_with_a_claim_owner_claims_nothing(tenant, actor):
    first = register(tenant, actor).task
    again = register(tenant, actor, claim_owner="w1")
    assert not again.created
    assert (again.task.pk, again.task.state, again.task.lease_owner) == (
        first.pk,
        "pending",
        None,
    )
    assert events_of(first) == [EventCode.TASK_REGISTERED]


def test_a_claim_owner_with_a_bad_ttl_registers_nothing(tenant, actor):
    with pytest.raises(ValidationFailed):
        register(tenant, actor, claim_owner="w1", claim_ttl_s=0)
    assert not Task.objects.filter(tenant=tenant).exists()


def test_registering_the_same_task_again_returns_it(tenant, actor):
    first = register(tenant, actor).task
    again = register(tenant, actor)
    assert not again.created and again.task.pk == first.pk
    assert events_of(first) == [EventCode.TASK_REGISTERED]


def test_registering_the_same_id_with_other_details_is_refused(tenant, actor):
    first = register(tenant, actor).task
    with pytest.raises(TaskIdReused) as caught:
        register(tenant, actor, object_version="8")
    assert caught.value.code == ReasonCode.IDEMPOTENCY_KEY_REUSED
    assert Task.objects.get(pk=first.pk).object_version == "7"


def test_the_same_client_id_in_two_tenants_is_two_tasks(tenant, other_tenant, actor):
    assert register(tenant, actor).task.pk != register(other_tenant, actor).task.pk


def test_a_contract_key_pins_the_newest_published_version(tenant, actor):
    services.contract_create(tenant=tenant, key="ci", spec=SPEC, publish=True)
    services.contract_create(tenant=tenant, key="ci", spec=SPEC, publish=True)
    services.contract_create(tenant=tenant, key="ci", spec=SPEC)  # v3 draft
    task = register(tenant, actor, contract_key="ci").task
    assert (task.contract_key, task.contract_version) == ("ci", 2)


def test_a_retired_contract_cannot_be_pinned(tenant, actor):
    services.contract_create(tenant=tenant, key="ci", spec=SPEC, publish=True)
    services.contract_retire(tenant=tenant, key="ci", version=1)
    with pytest.raises(ContractRetired) as caught:
        register(tenant, actor, contract_key="ci", contract_version=1)
    assert caught.value.code == ReasonCode.CONTRACT_RETIRED


@pytest.mark.parametrize("version", [None, 1, 9])
def test_a_draft_or_missing_contract_cannot_be_pinned(tenant, actor, version):
    services.contract_create(tenant=tenant, key="ci", spec=SPEC)  # draft v1
    with pytest.raises(ContractNotFound):
        register(tenant, actor, contract_key="ci", contract_version=version)
    assert not Task.objects.exists()


# --- Transitions ----------------------------------------------------------------------


def test_a_transition_moves_state_bumps_version_and_hands_back_the_lease(
    make_task, actor
):
    task = make_task(state=TaskState.RUNNING, leased=True)
    moved = services.task_transition(
        tenant=task.tenant,
        task_id=task.pk,
        to=TaskState.WAITING,
        expected_version=1,
        lease_token=task.lease_token,
        actor=actor,
        step="await-reply",
        wake_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
        data={"why": "customer"},
    )
    assert (moved.state, moved.state_version, moved.current_step) == (
        "waiting",
        2,
        "await-reply",
    )
    assert moved.lease_owner is None and moved.lease_token == task.lease_token
    event = Event.objects.get(task_id=task.pk)
    assert event.payload["from"] == "running" and event.payload["to"] == "waiting"
    assert event.payload["data"] == {"why": "customer"}


def test_a_stale_version_is_refused_and_changes_nothing(make_task, actor):
    task = make_task(state=TaskState.RUNNING, leased=True, state_version=4)
    with pytest.raises(StaleState) as caught:
        services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=3,
            lease_token=task.lease_token,
            actor=actor,
        )
    assert caught.value.context["state_version"] == 4
    assert Task.objects.get(pk=task.pk).state == TaskState.RUNNING
    assert not Event.objects.exists()


@pytest.mark.parametrize("problem", ["wrong-token", "expired", "released"])
def test_a_write_without_the_current_live_lease_is_refused(make_task, actor, problem):
    task = make_task(state=TaskState.RUNNING, leased=True, lease_token=3)
    token = task.lease_token
    if problem == "wrong-token":
        token = 2
    elif problem == "expired":
        expire_lease(task)
    else:
        Task.objects.filter(pk=task.pk).update(
            lease_owner=None, lease_expires_at=None, lease_acquired_at=None
        )
    with pytest.raises(LeaseExpired) as caught:
        services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=1,
            lease_token=token,
            actor=actor,
        )
    assert caught.value.code == ReasonCode.LEASE_EXPIRED
    assert Task.objects.get(pk=task.pk).state == TaskState.RUNNING


def test_an_illegal_transition_is_refused_before_the_trigger(make_task, actor):
    task = make_task(state=TaskState.RUNNING, leased=True)
    with pytest.raises(IllegalTransition):
        services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=TaskState.HUMAN_CLAIMED,
            expected_version=1,
            lease_token=task.lease_token,
            actor=actor,
        )


def test_another_tenants_task_is_not_found(make_task, other_tenant, actor):
    task = make_task(state=TaskState.RUNNING, leased=True)
    with pytest.raises(TaskNotFound):
        services.task_transition(
            tenant=other_tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=1,
            lease_token=task.lease_token,
            actor=actor,
        )


def test_bad_targets_are_validation_errors(make_task, actor):
    task = make_task(state=TaskState.RUNNING, leased=True)
    with pytest.raises(ValidationFailed):
        services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to="finished",
            expected_version=1,
            lease_token=1,
            actor=actor,
        )
    with pytest.raises(ValidationFailed):
        services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=1,
            lease_token=1,
            actor=actor,
            wake_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
        )


# --- Leases ---------------------------------------------------------------------------


def test_acquiring_a_free_lease_raises_the_fencing_token(make_task, actor):
    task = make_task(state=TaskState.PENDING, lease_token=7)
    leased = services.task_lease_acquire(
        tenant=task.tenant, task_id=task.pk, owner="w2", actor=actor, ttl_s=30
    )
    assert (leased.lease_owner, leased.lease_token) == ("w2", 8)
    assert leased.state_version == 1  # a lease is not a state change
    assert events_of(task) == [EventCode.TASK_LEASE_ACQUIRED]


def test_a_held_lease_cannot_be_acquired(make_task, actor):
    task = make_task(state=TaskState.RUNNING, leased=True)
    with pytest.raises(LeaseHeld):
        services.task_lease_acquire(
            tenant=task.tenant, task_id=task.pk, owner="w2", actor=actor
        )


def test_an_expired_lease_can_be_taken_over_and_fences_the_old_holder(make_task, actor):
    task = make_task(state=TaskState.RUNNING, leased=True, lease_token=1)
    expire_lease(task)
    taken = services.task_lease_acquire(
        tenant=task.tenant, task_id=task.pk, owner="w2", actor=actor
    )
    assert taken.lease_token == 2
    assert Event.objects.get(task_id=task.pk).payload["taken_over_from"] == "worker-1"
    with pytest.raises(LeaseExpired):
        services.task_transition(
            tenant=task.tenant,
            task_id=task.pk,
            to=TaskState.SUCCEEDED,
            expected_version=1,
            lease_token=1,
            actor=actor,
        )


@pytest.mark.parametrize("state", [TaskState.SUCCEEDED, TaskState.HUMAN_REQUIRED])
def test_finished_or_human_tasks_cannot_be_leased(make_task, actor, state):
    task = make_task(state=state)
    with pytest.raises(TaskNotLeasable):
        services.task_lease_acquire(
            tenant=task.tenant, task_id=task.pk, owner="w", actor=actor
        )


def test_renew_extends_a_live_lease_without_an_event(make_task):
    task = make_task(state=TaskState.RUNNING, leased=True, lease_seconds=5)
    renewed = services.task_lease_renew(
        tenant=task.tenant, task_id=task.pk, lease_token=task.lease_token, ttl_s=600
    )
    assert renewed.lease_expires_at > task.lease_expires_at + dt.timedelta(minutes=5)
    assert not Event.objects.exists()


def test_an_expired_lease_cannot_be_renewed(make_task):
    task = make_task(state=TaskState.RUNNING, leased=True)
    expire_lease(task)
    with pytest.raises(LeaseExpired):
        services.task_lease_renew(
            tenant=task.tenant, task_id=task.pk, lease_token=task.lease_token
        )


@pytest.mark.parametrize("ttl_s", [0, -1, 3601])
def test_lease_lengths_are_bounded(make_task, actor, ttl_s):
    task = make_task(state=TaskState.PENDING)
    with pytest.raises(ValidationFailed):
        services.task_lease_acquire(
            tenant=task.tenant, task_id=task.pk, owner="w", actor=actor, ttl_s=ttl_s
        )


def test_releasing_a_running_task_returns_it_to_pending(make_task, actor):
    task = make_task(state=TaskState.RUNNING, leased=True)
    released = services.task_lease_release(
        tenant=task.tenant, task_id=task.pk, lease_token=task.lease_token, actor=actor
    )
    assert (released.state, released.state_version, released.lease_owner) == (
        "pending",
        2,
        None,
    )
    assert Event.objects.get(task_id=task.pk).payload["to"] == "pending"


def test_claim_next_takes_the_oldest_pending_task_of_the_tenant(
    make_task, other_tenant, actor
):
    make_task(tenant=other_tenant)  # never visible to this tenant
    oldest = make_task()
    make_task()
    claimed = services.task_claim_next(tenant=oldest.tenant, owner="w", actor=actor)
    assert claimed is not None and claimed.pk == oldest.pk
    assert (claimed.state, claimed.state_version, claimed.lease_token) == (
        "running",
        2,
        1,
    )


@pytest.mark.parametrize("frozen", ["agent", "tenant"])
def test_claim_next_leaves_pending_tasks_to_an_unfrozen_claimer(
    make_task, agent, actor, frozen
):
    """The kill switch is read in the claim's own statement: a frozen agent (or
    tenant) claims nothing and is told why; the task stays pending for others."""
    task = make_task(state=TaskState.PENDING)
    row = agent if frozen == "agent" else agent.tenant
    type(row).objects.filter(pk=row.pk).update(frozen_at=Now())
    error = AgentFrozen if frozen == "agent" else TenantFrozen
    with pytest.raises(error):
        services.task_claim_next(tenant=task.tenant, owner="w", actor=actor)
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.lease_owner, stored.state_version) == (
        "pending",
        None,
        1,
    )
    if frozen == "agent":  # a person or the portal still claims it
        system = Actor.system("support")
        claimed = services.task_claim_next(tenant=task.tenant, owner="p", actor=system)
        assert claimed is not None and claimed.pk == task.pk


def test_claim_next_returns_none_when_nothing_is_pending(tenant, actor):
    assert services.task_claim_next(tenant=tenant, owner="w", actor=actor) is None


def test_claim_next_skips_pending_tasks_whose_lease_is_held(make_task, actor):
    make_task(state=TaskState.PENDING, leased=True)
    free = make_task(state=TaskState.PENDING)
    claimed = services.task_claim_next(tenant=free.tenant, owner="w", actor=actor)
    assert claimed is not None and claimed.pk == free.pk


def test_the_sql_clock_honours_the_test_offset(tenant):
    """app_now() is the one clock; tests move it with portal_set_clock_offset()."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT app_now() - statement_timestamp()")
        assert cursor.fetchone()[0] == dt.timedelta(0)
        cursor.execute("SELECT portal_set_clock_offset('1 hour')")
        cursor.execute("SELECT app_now() - statement_timestamp()")
        assert cursor.fetchone()[0] == dt.timedelta(hours=1)


def test_a_transition_event_records_the_fencing_token(make_task, actor):
    task = make_task(state=TaskState.RUNNING, leased=True, lease_token=5)
    services.task_transition(
        tenant=task.tenant,
        task_id=task.pk,
        to=TaskState.SUCCEEDED,
        expected_version=1,
        lease_token=5,
        actor=actor,
    )
    assert Event.objects.get(task_id=task.pk).payload["lease_token"] == 5
