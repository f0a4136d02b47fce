"""The JSON log canary (issue 12 §2): secrets and personal data planted in error
paths of a request, a job's enqueue and the gateway never reach a JSON log line.

The handler is built from the settings' own ``json`` formatter (portal/logs.py, the
audit trail's ``redact`` injected by dotted path). The raw records do carry the
canaries (the test checks that, so it can fail): a 404 whose path holds them, a
broker error quoting them when a queued execution's job is enqueued, and an
unhandled error inside the gateway's call. The declared personal field (a
customer's name, ``sensitive_fields``) goes where an agent puts it, the operation
input: a name in free text is not detected (docs/redaction.md), so it is not
planted in the error texts.
"""

from __future__ import annotations

import io
import json
import logging
import logging.config
import string
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from tasks import jobs
from tasks import services as task_services
from tasks.gateway import execute
from tests.gateway.conftest import SPEC, World
from tests.gateway.test_redaction_canary import _luhn_card, _rand

ALNUM = string.ascii_letters + string.digits


def _canaries() -> dict[str, str]:
    return {
        "email": f"canary.{_rand(string.ascii_lowercase, 8)}@example.org",
        "card": _luhn_card(),
        "github": "ghp_" + _rand(ALNUM, 36),
        "stripe": "sk_live_" + _rand(ALNUM, 24),
        "bearer": "Bearer " + _rand(ALNUM, 32),
        "person": f"Canary {_rand(string.ascii_uppercase, 6)} Person",
    }


def _note(c: dict[str, str]) -> str:
    return (
        f"refund for {c['email']} card {c['card']} token {c['github']} "
        f"key {c['stripe']} auth {c['bearer']}"
    )


class _Lines(logging.Handler):
    """Every record, formatted by the settings' JSON formatter; the raw messages."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        config: Any = logging.config.DictConfigurator(settings.LOGGING)
        self.setFormatter(
            config.configure_formatter(dict(settings.LOGGING["formatters"]["json"]))
        )
        self.stream = io.StringIO()
        self.raw: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        raw = record.getMessage()
        if record.exc_info:
            raw += "\n" + logging.Formatter().formatException(record.exc_info)
        self.raw.append(raw)
        self.stream.write(self.format(record) + "\n")

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()


@pytest.fixture
def json_lines() -> Iterator[_Lines]:
    handler = _Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def test_no_canary_reaches_a_json_log_line(
    world: World, json_lines: _Lines, monkeypatch: pytest.MonkeyPatch
):
    c = _canaries()
    note = _note(c)
    # Given: a contract declaring the customer's name personal, and two reserved
    # operations whose input carries the name under its declared key
    task_services.contract_create(
        tenant=world.tenant,
        key="customer-issue",
        spec={**SPEC, "sensitive_fields": {"customer": "personal"}},
        publish=True,
    )
    customer = {"customer": c["person"], "summary": f"refund for {c['person']}"}
    first = world.start_task(1, input=customer)
    second = world.start_task(2, input=customer)

    # When: a request's path carries the canaries (404, logged by django.request)
    missing = world.http.get(
        "/api/v1/tasks/" + urllib.parse.quote(note, safe=""),
    )
    assert missing.status_code == 404
    # And: the broker refuses a queued execution's job, quoting them
    def refusing_broker(**kwargs: Any) -> None:
        raise ConnectionRefusedError(f"broker said: {note}")

    monkeypatch.setattr(jobs.run_operation_job, "delay", refusing_broker)
    queued = world.http.post(
        f"/api/v1/operations/{first['operation']['id']}/execute",
        json={"field_values": world.fields()},
        headers={"Lease-Token": str(first["token"]), "Prefer": "respond-async"},
    )
    assert queued.status_code == 202, queued.text
    # And: the gateway's call fails with an error that quotes them
    def failing_call(**kwargs: Any) -> None:
        raise RuntimeError(f"connector exploded: {note}")

    monkeypatch.setattr(execute, "call", failing_call)
    failed = world.execute(second)
    assert failed.status_code == 500, failed.text

    # Then: the raw records held the canaries (the paths ran and logged them) ...
    raw = "\n".join(json_lines.raw)
    for name in ("email", "card", "github", "stripe", "bearer"):
        assert c[name] in raw, name
    # ... and no JSON line holds any of them, in any usual encoding
    lines = json_lines.lines()
    records = [json.loads(line) for line in lines]
    messages = [r["message"] for r in records]
    assert any(m.startswith("Not Found: /api/v1/tasks/") for m in messages)
    assert any(m.startswith("could not enqueue operation") for m in messages)
    assert any(m.startswith("unhandled API error") for m in messages)
    text = "\n".join(lines)
    for name, value in c.items():
        for variant in {
            value,
            json.dumps(value)[1:-1],
            urllib.parse.quote(value, safe=""),
            value.removeprefix("Bearer "),
        }:
            assert variant not in text, (name, variant)
    assert "[email:hm_" in text and "[card:hm_" in text and "[REDACTED" in text
    # And: a line written while serving an operation names it and its tenant
    crash = next(r for r in records if r["message"].startswith("unhandled API error"))
    assert crash["operation_id"] == second["operation"]["id"]
    assert crash["tenant_id"] == str(world.tenant.pk)
    assert "connector exploded" in crash["exc_info"]
    assert failed.json()["correlation_id"] == crash["correlation_id"]


def test_a_line_carries_tenant_task_operation_and_trace(json_lines: _Lines):
    from portal import logs, scope, tracing
    from tests.support.spans import in_memory_exporter

    in_memory_exporter()
    tenant, task, operation = (str(uuid.uuid4()) for _ in range(3))
    with (
        scope.tenant_scope([tenant]),
        logs.bind(task_id=task, operation_id=operation),
        tracing.tracer("test").start_as_current_span("work"),
    ):
        current = tracing.Trace.current()
        logging.getLogger("portal.test").info("working")
    (line,) = [json.loads(x) for x in json_lines.lines() if '"working"' in x]
    assert line["tenant_id"] == tenant
    assert line["task_id"] == task and line["operation_id"] == operation
    assert line["trace_id"] == current.trace_id
    assert line["span_id"] == current.span_id
    assert line["level"] == "INFO" and line["logger"] == "portal.test"
