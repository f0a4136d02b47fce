"""The scale loader writes each event code's payload in the live shape.

``config/scale_data`` COPYs events that mypy never sees, so a payload could drift
from the one the services write (``task.lease_expired`` without ``owner``,
``task.woken`` without ``state_version``, ``connector.called`` without
``credentials_revoked`` did). These tests read what the loader wrote and hold each
payload to its code's ``TypedDict`` in ``audit/payloads.py``
(``tests/support/payload_shapes.py``): every story the loader can tell, then a
tiny load through the command, read back with raw SQL.
"""

from __future__ import annotations

import ast
import datetime as dt
import io
import json
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from audit.models import EventCode
from config.scale_data import stories
from config.scale_data.rows import (
    MAX_EVENTS_PER_TASK,
    MIN_EVENTS_PER_TASK,
    STATE_MIX,
    Chunk,
    Ids,
    TenantSetUp,
)
from tests.support import payload_shapes

EVENT_PAYLOAD = 10  # rows.EVENT_COLUMNS: code at 4, payload (JSON text) at 10
EVENT_CODE = 4


def _story_codes() -> set[str]:
    """The event codes ``config/scale_data/stories.py`` writes, read from its source
    (every string literal that is an event code)."""
    source = Path(stories.__file__).read_text()
    codes = set(EventCode.values)
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and node.value in codes
    }


def test_the_check_finds_each_old_shape() -> None:
    # given the three payloads the loader wrote before, and their live shapes
    old: dict[str, dict[str, Any]] = {
        "task.lease_expired": {"from": "running", "to": "pending", "lease_token": 2},
        "task.woken": {"from": "waiting", "to": "pending"},
        "connector.called": {
            "attempt": 1, "outcome": "succeeded", "status": 201, "error": "",
            "provider_reference": "T-1", "retry_after_s": None, "duration_ms": 40,
        },
    }  # fmt: skip
    # then each is refused for the key it lacks, and a live one passes
    assert payload_shapes.problems("task.lease_expired", old["task.lease_expired"]) == [
        "owner: missing"
    ]
    assert payload_shapes.problems("task.woken", old["task.woken"]) == [
        "state_version: missing"
    ]
    assert payload_shapes.problems("connector.called", old["connector.called"]) == [
        "credentials_revoked: missing"
    ]
    live = {**old["connector.called"], "credentials_revoked": [str(uuid.uuid4())]}
    assert payload_shapes.problems("connector.called", live) == []
    # and a stray key, a wrong type and a bool for an int are refused too
    assert payload_shapes.problems(
        "task.woken", {"from": "waiting", "to": 3, "state_version": True, "x": 1}
    ) == [
        "x: not in TaskWoken",
        "state_version: True, not int",
        "to: 3, not str",
    ]
    # and a NotRequired key may be absent, but not of another type
    reserved = {
        "idempotency_key": "k", "action": "a", "target": "t", "input_hash": "h",
        "lease_token": None,
    }  # fmt: skip
    assert payload_shapes.problems("operation.reserved", reserved) == []
    assert payload_shapes.problems(
        "operation.reserved", {**reserved, "limits": {}}
    ) == ["limits: dict, not a list"]


def test_every_story_the_loader_tells_is_in_the_live_shape() -> None:
    # given one tenant's set-up, as the loader has it
    rng = random.Random(24)
    ids = Ids(rng)
    tenant = TenantSetUp(
        id=str(uuid.uuid4()),
        slug="scale-t01",
        agents=((str(uuid.uuid4()), "agent-1"), (str(uuid.uuid4()), "agent-2")),
        support_user_ids=(7, 8),
        contract_version=1,
    )
    # when it tells every state's story at every length, several times (a share
    # of them go through a person, by the draw)
    chunk = Chunk()
    now = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    index = 0
    for state, _ in STATE_MIX:
        for events in range(MIN_EVENTS_PER_TASK, MAX_EVENTS_PER_TASK + 1):
            for _ in range(40):
                index += 1
                stories.task_story(
                    chunk=chunk, rng=rng, ids=ids, tenant=tenant, index=index,
                    state=state, events=events, created_at=now, outbox_share=1.0,
                )  # fmt: skip
    # then every event it wrote is its code's live shape
    seen: Counter[str] = Counter()
    found: dict[str, list[str]] = {}
    for row in chunk.rows["audit_event"]:
        code = row[EVENT_CODE]
        seen[code] += 1
        wrong = payload_shapes.problems(code, json.loads(row[EVENT_PAYLOAD]))
        if wrong:
            found.setdefault(code, wrong)
    assert found == {}
    # and each code the stories write was among them (the walk reached every path)
    assert set(seen) == _story_codes()


@pytest.mark.django_db(transaction=True)
def test_a_tiny_load_stores_every_event_in_the_live_shape() -> None:
    # given a tiny load through the command (its set-up through the services too)
    call_command(
        "load_scale_data", tasks=120, events=1200, tenants=2, writers=0,
        stdout=io.StringIO(), stderr=io.StringIO(),
    )  # fmt: skip
    # when every stored event is read back as the database holds it
    with connection.cursor() as cursor:
        cursor.execute("SELECT code, payload::text FROM audit_event ORDER BY id")
        rows = cursor.fetchall()
    # then each payload is its code's live shape
    assert len(rows) >= 1200  # the tasks' events (and any the set-up wrote)
    found: dict[str, list[str]] = {}
    for code, payload in rows:
        wrong = payload_shapes.problems(code, json.loads(payload))
        if wrong:
            found.setdefault(code, wrong)
    assert found == {}
    codes = {code for code, _ in rows}
    assert {"task.registered", "gateway.checked", "connector.called"} <= codes
