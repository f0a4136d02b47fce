"""The transition's one statement writes the event ``event_append`` would (issue 23).

``task_transition`` writes the task, its event, the chain link and the outbox row in
one statement, the payload's ``from`` and ``step`` filled in by PostgreSQL. These
tests hold it to the two-statement write, byte for byte where it matters: the stored
payload, its digest (the database hashed the text it built), the chain that
``verify_audit`` checks, and the redaction of a step redaction would change.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from audit import chain
from audit.models import Event, Outbox
from audit.redaction import redact
from portal.actors import Actor
from portal.tracing import NO_TRACE
from tasks import services
from tasks.models import Task, TaskState
from tasks.services.tasks import _task_transition_write

pytestmark = pytest.mark.django_db(transaction=True)

# JSON escapes and characters outside the BMP: PostgreSQL must write them as RFC 8785.
NASTY_STEP = 'a "quoted"\n\ttab\\slash ñ € 😀 \u2028 \x01 end'


def transition(task: Task, actor: Actor, **kwargs: Any) -> Task:
    return services.task_transition(
        tenant=task.tenant,
        task_id=task.pk,
        to=kwargs.pop("to", TaskState.WAITING),
        expected_version=task.state_version,
        lease_token=task.lease_token,
        actor=actor,
        **kwargs,
    )


def statements_of(call: Callable[[], Any]) -> list[str]:
    seen: list[str] = []

    def capture(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        call()
    return seen


def the_event(task: Task) -> Event:
    (event,) = Event.objects.filter(task_id=task.pk)
    return event


def verify_audit(tenant_slug: str) -> tuple[int, str]:
    out = io.StringIO()
    call_command("checkpoint_audit", stdout=io.StringIO())
    try:
        call_command("verify_audit", tenant=tenant_slug, stdout=out, stderr=out)
    except SystemExit as stop:
        return int(stop.code or 0), out.getvalue()
    return 0, out.getvalue()


@pytest.mark.parametrize(
    ("step", "data"),
    [
        (None, None),
        (NASTY_STEP, None),
        ("checkout", {"note": NASTY_STEP, "n": 7, "ok": True, "list": [1, "x", None]}),
    ],
)
def test_one_statement_writes_what_two_would(make_task, actor, step, data) -> None:
    # given two running tasks, the second written the two-statement way
    one, two = (make_task(state=TaskState.RUNNING, leased=True) for _ in range(2))
    seen = statements_of(lambda: transition(one, actor, step=step, data=data))
    _task_transition_write(
        tenant=two.tenant, task_id=two.pk, to=TaskState.WAITING, expected_version=1,
        lease_token=two.lease_token, actor=actor, reason=None, step=step,
        wake_at=None, data=data or {}, trace=NO_TRACE, one_statement=False,
        round_trip=False,
    )  # fmt: skip
    # then the service ran one statement, and both events hold the same payload
    assert len(seen) == 1 and "INSERT INTO audit_outbox" in seen[0], seen
    fast, slow = the_event(one), the_event(two)
    assert fast.payload == slow.payload
    assert fast.payload["from"] == TaskState.RUNNING
    assert fast.payload["step"] == (step or "")
    # the digest is the canonical payload's, as the verifier recomputes it
    assert fast.payload_digest == slow.payload_digest
    assert fast.payload_digest == chain.payload_digest(fast.payload)
    assert (fast.chain_seq, fast.prev_hash) == (1, None)
    (outbox,) = Outbox.objects.filter(event_id=fast.pk)
    assert outbox.payload["data"] == fast.payload
    assert outbox.payload["event_id"] == str(fast.pk)
    # and the chain verifies
    code, output = verify_audit(one.tenant.slug)
    assert code == 0, output


def test_a_task_with_a_step_moves_without_one(make_task, actor) -> None:
    # given a task whose current step was set by an earlier transition
    task = make_task(state=TaskState.PENDING, leased=True)
    running = transition(task, actor, to=TaskState.RUNNING, step=NASTY_STEP)
    # when it moves on without a step or data (the one round trip asks for a blank
    # step, so this one is written in a transaction of its own)
    tenant = running.tenant
    seen = statements_of(lambda: transition(running, actor, to=TaskState.SUCCEEDED))
    assert tenant.pk == task.tenant_id
    # then the event names the step the task is at, and the trail verifies
    assert len(seen) == 2, seen  # the round trip found nothing to write; then one
    events = list(Event.objects.filter(task_id=task.pk).order_by("chain_seq"))
    assert [e.payload["step"] for e in events] == [NASTY_STEP, NASTY_STEP]
    assert Task.objects.get(pk=task.pk).state == TaskState.SUCCEEDED
    assert verify_audit(task.tenant.slug)[0] == 0


def test_a_step_redaction_would_change_is_written_redacted(make_task, actor) -> None:
    # a high-entropy step passes refuse_sensitive (no entropy test for identifiers)
    # but redaction of an event payload replaces it
    secretish = "Zq8vN2xK7pL4wR9tY3mB6cH1"
    assert redact({"step": secretish}, tenant_id=actor.id)["step"] != secretish
    task = make_task(state=TaskState.RUNNING, leased=True)
    moved = transition(task, actor, step=secretish)
    # then the event holds the redacted step: the one-statement write was rolled
    # back and the transition written the two-statement way, once
    event = the_event(task)
    assert event.payload["step"] != secretish
    assert event.payload == redact(
        {
            "from": "running", "to": "waiting", "state_version": 2,
            "step": secretish, "lease_token": task.lease_token, "data": {},
        },
        tenant_id=task.tenant_id,
        max_bytes=settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES // 2,
    )  # fmt: skip
    assert Outbox.objects.filter(event_id=event.pk).count() == 1
    assert (moved.state, moved.state_version) == (TaskState.WAITING, 2)
    assert Task.objects.get(pk=task.pk).state_version == 2
    assert verify_audit(task.tenant.slug)[0] == 0


def test_the_next_event_of_a_chain_links_to_the_last(make_task, actor) -> None:
    # given a leased pending task moved to running (the lease stays) and on
    task = make_task(state=TaskState.PENDING, leased=True)
    running = transition(task, actor, to=TaskState.RUNNING, step=NASTY_STEP)
    transition(running, actor, to=TaskState.SUCCEEDED, data={"n": 1})
    # then its two events form one line, and the trail verifies
    events = list(Event.objects.filter(task_id=task.pk).order_by("chain_seq"))
    assert [e.chain_seq for e in events] == [1, 2]
    assert events[1].prev_hash == events[0].hash
    assert [e.payload["from"] for e in events] == ["pending", "running"]
    assert events[1].payload["step"] == NASTY_STEP
    assert verify_audit(task.tenant.slug)[0] == 0
