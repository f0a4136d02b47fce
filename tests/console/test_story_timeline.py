"""The task's timeline (console/story.py ``event_rows``), the one rendering of a
task's events on its story page and its desk item: one row per step (a check pass
is one row, the one-event-per-check form folds too), the time since the step
before, and how long a person's part took."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.contrib.auth.models import User

from audit.models import Event, EventCode
from console.story import duration, event_rows, is_live
from portal.actor_names import ActorNames
from tasks.models import TaskState

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.UTC)
OPERATION = uuid.uuid4()


def _event(
    code: str,
    seconds: float,
    payload: dict,
    *,
    actor: tuple[str, str] = ("agent", "a1"),
    reason: str | None = None,
    operation: uuid.UUID | None = OPERATION,
) -> Event:
    return Event(
        id=uuid.uuid4(),
        code=code,
        created_at=T0 + dt.timedelta(seconds=seconds),
        actor_type=actor[0],
        actor_id=actor[1],
        operation_id=operation,
        reason_code=reason,
        payload=payload,
    )


def _rows(events: list[Event], tenant) -> list[dict]:
    names = ActorNames(
        [(e.actor_type, e.actor_id) for e in events], tenant_ids=[tenant.pk]
    )
    return event_rows(events, names)


def test_a_check_pass_is_one_row_with_every_verdict_and_the_refusal_evidence(tenant):
    events = [
        _event(EventCode.OPERATION_RESERVED, 0, {"action": "create_ticket"}),
        _event(
            EventCode.GATEWAY_CHECKED,
            0.25,
            {
                "verdict": "refused",
                "check": "fields",
                "checks": [
                    {"check": "contract", "verdict": "passed"},
                    {
                        "check": "fields",
                        "verdict": "refused",
                        "conflicting_fields": [
                            {"field": "plan", "problem": "FIELD_MISSING"}
                        ],
                    },
                ],
            },
            reason="FIELD_MISSING",
        ),
    ]

    rows = _rows(events, tenant)

    assert [r["code"] for r in rows] == ["operation.reserved", "gateway.checked"]
    assert rows[0]["after"] == ""
    assert rows[1]["after"] == "+250 ms"
    assert rows[1]["reason"] == "FIELD_MISSING"
    assert rows[1]["payload"] == [
        ("checks", "contract ✓, fields ✗"),
        ("fields.conflicting_fields[0].field", "plan"),
        ("fields.conflicting_fields[0].problem", "FIELD_MISSING"),
    ]


def test_the_old_one_event_per_check_rows_fold_into_one_step(tenant):
    checks = [
        _event(
            EventCode.GATEWAY_CHECKED, 1 + i / 100, {"check": c, "verdict": "passed"}
        )
        for i, c in enumerate(("contract", "fields", "target", "permission"))
    ]
    refused = _event(
        EventCode.GATEWAY_CHECKED,
        1.05,
        {"check": "version", "verdict": "refused", "version_read": "7"},
        reason="VERSION_CONFLICT",
    )
    other_operation = _event(
        EventCode.GATEWAY_CHECKED,
        1.06,
        {"check": "contract", "verdict": "passed"},
        operation=uuid.uuid4(),
    )

    rows = _rows([*checks, refused, other_operation], tenant)

    assert len(rows) == 2  # another operation's checks are another step
    assert rows[0]["payload"] == [
        ("checks", "contract ✓, fields ✓, target ✓, permission ✓, version ✗"),
        ("version.version_read", "7"),
    ]
    assert rows[0]["reason"] == "VERSION_CONFLICT"
    assert rows[1]["after"] == "+10 ms"  # after the last check of the fold


def test_the_desk_wait_and_the_persons_hold_are_said_in_minutes(tenant):
    sam = User.objects.create_user("sam")
    person = ("user", str(sam.pk))
    events = [
        _event(EventCode.TASK_ESCALATED, 0, {"to": "human_required"}),
        _event(EventCode.TASK_HUMAN_CLAIMED, 180, {}, actor=person),
        _event(EventCode.TASK_RESOLVED, 180 + 7 * 60, {}, actor=person),
    ]

    rows = _rows(events, tenant)

    assert [r["note"] for r in rows] == [
        "",
        "waited 3 min on the desk",
        "held 7 min by sam (person)",
    ]
    assert [r["after"] for r in rows] == ["", "+3 min", "+7 min"]


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.004, "4 ms"), (2.25, "2.2 s"), (59.9, "59.9 s"), (61, "1 min"),
     (3600, "1 h"), (3600 + 25 * 60, "1 h 25 min"), (-1, "0 ms")],
)  # fmt: skip
def test_durations_read_at_a_glance(seconds: float, said: str):
    assert duration(dt.timedelta(seconds=seconds)) == said


def test_a_task_refreshes_while_it_can_change(make_task):
    assert is_live(make_task(state=TaskState.HUMAN_REQUIRED))
    assert not is_live(make_task(state=TaskState.SUCCEEDED))
