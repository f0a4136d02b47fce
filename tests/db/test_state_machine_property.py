"""Invariant 3 as a property (R04): random walks through the task and operation
state machines, driven by the services, checked against the database.

Each step is a service call a worker, the portal or a person could make, legal or
not: a move to any state, under the current lease token or a wrong one, at the
current ``expected_version`` or a stale one. A model built from ``TASK_TRANSITIONS``
and ``OPERATION_TRANSITIONS`` says whether the call must be accepted or refused.
After every step the rows are read back with raw SQL: the state is the model's,
``state_version`` and ``lease_token`` never fall, each accepted call added its
events to the task's chain and a refused one none, and a raw ``UPDATE`` to a
state the machine does not allow is refused by the trigger.

Bounded for CI (50 walks of up to 20 steps); ``PORTAL_PROPERTY_EXAMPLES=1000``
(and ``PORTAL_PROPERTY_STEPS``) raise it for a run by hand.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from itertools import count

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from portal import services as portal_services
from portal.codes import ReasonCode
from portal.exceptions import IllegalTransition, LeaseExpired, StaleState
from portal.models import Role
from tasks import escalation, selectors, services, takeover
from tasks.exceptions import AlreadyClaimed, LeaseHeld, TaskNotLeasable
from tasks.models import (
    OPERATION_TRANSITIONS,
    TASK_TRANSITIONS,
    OperationState,
    Task,
    TaskState,
)

from .conftest import refused_by

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("PORTAL_PROPERTY_EXAMPLES", "50"))
STEPS = int(os.environ.get("PORTAL_PROPERTY_STEPS", "20"))

LEASABLE = {TaskState.PENDING, TaskState.RUNNING, TaskState.WAITING}
# The states an agent's own start or outcome may come from (tasks/services/operations.py
# docstrings: begin from reserved or unknown, never from human_required).
SELF_REPORTED: dict[str, set[str]] = {
    OperationState.EXECUTING: {OperationState.RESERVED, OperationState.UNKNOWN},
    OperationState.VERIFIED: {OperationState.EXECUTING, OperationState.UNKNOWN},
    OperationState.FAILED: {
        OperationState.RESERVED,
        OperationState.EXECUTING,
        OperationState.UNKNOWN,
    },
    OperationState.UNKNOWN: {OperationState.EXECUTING},
}
REFUSED = (IllegalTransition, StaleState, LeaseExpired, LeaseHeld, TaskNotLeasable)
_ids = count()


@dataclass
class OperationModel:
    id: uuid.UUID
    state: str = OperationState.RESERVED
    version: int = 1


@dataclass
class TaskModel:
    state: str = TaskState.PENDING
    version: int = 1
    token: int = 0
    leased: bool = False  # a live lease, the agent's or a person's
    events: int = 1  # task.registered
    operations: list[OperationModel] = field(default_factory=list)


def illegal_target(state: str, transitions: frozenset[tuple[str, str]], states):
    return next(s for s in states if s != state and (state, s) not in transitions)


class TaskMachine(RuleBasedStateMachine):
    def __init__(self, tenant, actor, person) -> None:
        super().__init__()
        self.tenant, self.actor, self.person = tenant, actor, person
        self.seen = (1, 0)  # the last state_version and lease_token read back

    @initialize(started=st.booleans())
    def register(self, started: bool) -> None:
        registration = services.task_register(
            tenant=self.tenant,
            actor=self.actor,
            client_task_id=f"walk-{next(_ids)}-{uuid.uuid4().hex[:8]}",
            workflow_key="customer-issue",
            workflow_version="1",
            object_type="customer_issue",
            object_id="42",
            object_version="1",
        )
        self.task_id = registration.task.pk
        self.model = TaskModel()
        if started:  # half the walks start at work: leased, running, one reservation
            self.lease_acquire()
            self.transition(to=TaskState.RUNNING, good_token=True, fresh=True)
            self.reserve(good_token=True)

    # --- helpers -----------------------------------------------------------------

    def _token(self, good: bool) -> int:
        return self.model.token if good else self.model.token - 1

    def _version(self, fresh: bool) -> int:
        return self.model.version if fresh else self.model.version - 1

    def _call(self, accepted: bool, call) -> object | None:
        """Run ``call``; it must be accepted or refused as the model says."""
        if accepted:
            return call()
        with pytest.raises(REFUSED):
            call()
        return None

    def _lease_ok(self, good_token: bool) -> bool:
        return good_token and self.model.leased

    # --- task rules --------------------------------------------------------------

    @rule()
    def lease_acquire(self) -> None:
        m = self.model
        accepted = m.state in LEASABLE and not m.leased
        task = self._call(
            accepted,
            lambda: services.task_lease_acquire(
                tenant=self.tenant, task_id=self.task_id, owner="w", actor=self.actor
            ),
        )
        if accepted:
            m.token, m.leased, m.events = m.token + 1, True, m.events + 1
            assert task.lease_token == m.token  # type: ignore[attr-defined]

    @rule(
        to=st.sampled_from(TaskState.values),
        good_token=st.booleans(),
        fresh=st.booleans(),
    )
    def transition(self, to: str, good_token: bool, fresh: bool) -> None:
        m = self.model
        accepted = (
            self._lease_ok(good_token) and fresh and (m.state, to) in TASK_TRANSITIONS
        )
        self._call(
            accepted,
            lambda: services.task_transition(
                tenant=self.tenant,
                task_id=self.task_id,
                to=to,
                expected_version=self._version(fresh),
                lease_token=self._token(good_token),
                actor=self.actor,
                reason=ReasonCode.RESULT_UNKNOWN
                if to == TaskState.HUMAN_REQUIRED
                else None,
            ),
        )
        if accepted:
            m.state, m.version, m.events = to, m.version + 1, m.events + 1
            m.leased = to == TaskState.RUNNING

    @rule(data=st.data())
    def transition_declared(self, data: st.DataObject) -> None:
        """A declared move under the current token and version: walks go deep."""
        targets = sorted(
            to for source, to in TASK_TRANSITIONS if source == self.model.state
        )
        if targets:
            self.transition(
                to=data.draw(st.sampled_from(targets)), good_token=True, fresh=True
            )

    @rule(good_token=st.booleans())
    def lease_release(self, good_token: bool) -> None:
        m = self.model
        accepted = self._lease_ok(good_token)
        self._call(
            accepted,
            lambda: services.task_lease_release(
                tenant=self.tenant,
                task_id=self.task_id,
                lease_token=self._token(good_token),
                actor=self.actor,
            ),
        )
        if accepted:
            if m.state == TaskState.RUNNING:
                m.state, m.version = TaskState.PENDING, m.version + 1
            m.leased, m.events = False, m.events + 1

    @rule(index=st.integers(0, 5), with_operation=st.booleans())
    def escalate(self, index: int, with_operation: bool) -> None:
        m = self.model
        op = None
        if with_operation and m.operations:
            op = m.operations[index % len(m.operations)]
        with transaction.atomic():
            escalation.escalate(
                tenant=self.tenant,
                task=Task.objects.get(pk=self.task_id),
                operation=selectors.operation_get(
                    tenant=self.tenant, operation_id=op.id
                )
                if op
                else None,
                reason=ReasonCode.RESULT_UNKNOWN,
                evidence={"walk": True},
                actor=self.actor,
            )
        # task.escalated, whether or not anything moved (the desk's assignment
        # event is the routing's, not the machines').
        m.events += 1
        if op and (op.state, OperationState.HUMAN_REQUIRED) in OPERATION_TRANSITIONS:
            op.state, op.version = OperationState.HUMAN_REQUIRED, op.version + 1
            m.events += 1
        if m.state in LEASABLE:
            m.state, m.version = TaskState.HUMAN_REQUIRED, m.version + 1
            m.token, m.leased = m.token + 1, False

    @rule()
    def human_claim(self) -> None:
        m = self.model
        accepted = m.state == TaskState.HUMAN_REQUIRED
        task = Task.objects.get(pk=self.task_id)
        if accepted:
            takeover.task_human_claim(task=task, user=self.person)
            m.state, m.version, m.token = (
                TaskState.HUMAN_CLAIMED,
                m.version + 1,
                m.token + 1,
            )
            m.leased, m.events = True, m.events + 1
        else:
            with pytest.raises((IllegalTransition, AlreadyClaimed)):
                takeover.task_human_claim(task=task, user=self.person)

    # --- operation rules ---------------------------------------------------------

    @precondition(lambda self: len(self.model.operations) < 4)
    @rule(good_token=st.booleans())
    def reserve(self, good_token: bool) -> None:
        m = self.model
        accepted = self._lease_ok(good_token)
        reservation = self._call(
            accepted,
            lambda: services.operation_reserve(
                tenant=self.tenant,
                task_id=self.task_id,
                lease_token=self._token(good_token),
                idempotency_key=f"key-{uuid.uuid4().hex}",
                action="create_ticket",
                target="ticket-desk",
                input={"n": len(m.operations)},
                actor=self.actor,
            ),
        )
        if accepted:
            operation = reservation.operation  # type: ignore[attr-defined]
            m.operations.append(OperationModel(id=operation.pk))
            m.events += 1

    @precondition(lambda self: self.model.operations)
    @rule(
        index=st.integers(0, 5),
        to=st.sampled_from(list(SELF_REPORTED)),
        good_token=st.booleans(),
    )
    def self_reported(self, index: int, to: str, good_token: bool) -> None:
        """The agent's own start (``begin_execution``) or outcome, under its lease."""
        m = self.model
        op = m.operations[index % len(m.operations)]
        accepted = self._lease_ok(good_token) and op.state in SELF_REPORTED[to]
        assert not accepted or (op.state, to) in OPERATION_TRANSITIONS
        if to == OperationState.EXECUTING:

            def call():
                return services.operation_begin_execution(
                    tenant=self.tenant,
                    operation_id=op.id,
                    lease_token=self._token(good_token),
                    actor=self.actor,
                )
        else:

            def call():
                return services.operation_record_outcome(
                    tenant=self.tenant,
                    operation_id=op.id,
                    lease_token=self._token(good_token),
                    outcome=to,
                    actor=self.actor,
                    provider_reference="receipt-1",
                )

        self._call(accepted, call)
        if accepted:
            op.state, op.version, m.events = to, op.version + 1, m.events + 1

    @precondition(lambda self: self.model.operations)
    @rule(
        index=st.integers(0, 5),
        to=st.sampled_from(OperationState.values),
        fresh=st.booleans(),
    )
    def portal_move(self, index: int, to: str, fresh: bool) -> None:
        """The portal's or a person's move, guarded by the operation's version."""
        m = self.model
        op = m.operations[index % len(m.operations)]
        accepted = fresh and (op.state, to) in OPERATION_TRANSITIONS

        def call():
            with transaction.atomic():
                return services.operation_move(
                    tenant=self.tenant,
                    operation_id=op.id,
                    to=OperationState(to),
                    expected_version=op.version if fresh else op.version - 1,
                    actor=self.actor,
                    provider_reference="receipt-1"
                    if to == OperationState.VERIFIED
                    else None,
                )

        self._call(accepted, call)
        if accepted:
            op.state, op.version, m.events = to, op.version + 1, m.events + 1

    @precondition(lambda self: self.model.operations)
    @rule(index=st.integers(0, 5), data=st.data())
    def portal_move_declared(self, index: int, data: st.DataObject) -> None:
        op = self.model.operations[index % len(self.model.operations)]
        targets = sorted(
            to for source, to in OPERATION_TRANSITIONS if source == op.state
        )
        if targets:
            self.portal_move(
                index=index, to=data.draw(st.sampled_from(targets)), fresh=True
            )

    # --- invariants: read back with raw SQL --------------------------------------

    @invariant()
    def rows_match_the_model(self) -> None:
        m = self.model
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT state, state_version, lease_token,"
                " lease_owner IS NOT NULL AND lease_expires_at > app_now(),"
                " (SELECT count(*) FROM audit_event WHERE task_id = t.id"
                "   AND (code LIKE 'task.%%' OR code LIKE 'operation.%%'))"
                " FROM tasks_task AS t WHERE id = %s",
                [self.task_id],
            )
            state, version, token, leased, events = cursor.fetchone()
            assert (state, version, token, leased) == (
                m.state,
                m.version,
                m.token,
                m.leased,
            )
            assert (version, token) >= self.seen and token >= self.seen[1]
            self.seen = (version, token)
            assert events == m.events, "one event per accepted call, none per refusal"
            for op in m.operations:
                cursor.execute(
                    "SELECT state, state_version FROM tasks_operation WHERE id = %s",
                    [op.id],
                )
                assert cursor.fetchone() == (op.state, op.version)

    @invariant()
    def the_trigger_refuses_an_undeclared_task_move(self) -> None:
        target = illegal_target(self.model.state, TASK_TRANSITIONS, TaskState.values)
        with refused_by("tasks_task_transition_trg"), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE tasks_task SET state = %s, state_version = state_version + 1"
                " WHERE id = %s",
                [target, self.task_id],
            )

    @invariant()
    def the_trigger_refuses_an_undeclared_operation_move(self) -> None:
        for op in self.model.operations:
            target = illegal_target(
                op.state, OPERATION_TRANSITIONS, OperationState.values
            )
            with (
                refused_by("tasks_operation_transition_trg"),
                connection.cursor() as cursor,
            ):
                cursor.execute(
                    "UPDATE tasks_operation SET state = %s,"
                    " state_version = state_version + 1 WHERE id = %s",
                    [target, op.id],
                )


def test_random_walks_through_the_services_keep_the_machines(tenant, actor):
    person = User.objects.create_user(
        f"walker-{uuid.uuid4().hex[:8]}", password="pw-for-tests-only-1"
    )
    portal_services.membership_grant(tenant=tenant, user=person, role=Role.SUPPORT)
    run_state_machine_as_test(
        lambda: TaskMachine(tenant, actor, person),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
