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
from tests.gateway.conftest import World
from tests.gateway.test_redaction_canary import _luhn_card, _rand
from tests.support.contracts import SPEC

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


def test_a_500_with_debug_off_shows_and_reports_no_canary(
    world: World, json_lines: _Lines, settings: Any
):
    """A 500 with ``DEBUG=False`` (S10): the answer, the JSON log lines and the
    error-report e-mail Django's ``mail_admins`` handler sends hold no canary.

    The failure is real: the database refuses the write mid-request. As the schema
    owner the test revokes the app role's UPDATE on ``tasks_task`` (a grant lost in
    a botched migration), so a transition's request passes authentication, reads
    the task, and fails on its update with ``permission denied``: an unhandled error.
    The request carries canaries in its query string, its headers (the agent's real
    key in ``Authorization: Bearer``, a cookie, a user agent, a custom header) and
    its JSON body. ``ADMINS`` is set so the report is sent (to Django's in-memory
    mailbox). The PostgreSQL server log's new lines are read too.
    """
    from django.core import mail

    from portal import db_roles
    from tests.gateway.test_redaction_canary import Sinks, _canaries, _nested
    from tests.support.db import ServerLog, connect_as

    assert settings.DEBUG is False
    settings.ADMINS = [("Operations", "ops@example.org")]
    mail.outbox = []
    c = _canaries()
    c["agent_key_in_use"] = world.http.headers["Authorization"].removeprefix("Bearer ")
    started = world.start_task(1)
    server_log = ServerLog()
    refuse = f"REVOKE UPDATE ON tasks_task FROM {db_roles.app_role()}"
    with connect_as("owner", autocommit=True) as owner:
        owner.execute(refuse)
        try:
            failed = world.http.post(
                f"/api/v1/tasks/{started['task']['id']}/transitions",
                params={"debug": c["github"], "contact": c["email"], "t": c["jwt"]},
                json={
                    "to": "waiting",
                    "expected_state_version": started["task"]["state_version"],
                    "payload": _nested(c),
                },
                headers={
                    "Lease-Token": str(started["token"]),
                    "User-Agent": f"agent/1 {c['aws']}",
                    "X-Customer-Note": f"{c['email']} {c['card']} {c['stripe']}",
                    "Cookie": f"sessionid={c['slack']}",
                },
            )
        finally:
            owner.execute(f"GRANT UPDATE ON tasks_task TO {db_roles.app_role()}")
    assert failed.status_code == 500, failed.text
    # the raw records show the refusal and the request (the paths ran)
    assert "permission denied for table tasks_task" in "\n".join(json_lines.raw)
    assert len(mail.outbox) == 1, [m.subject for m in mail.outbox]
    report = mail.outbox[0]
    sinks = Sinks()
    sinks.add("500 response", failed.text + "\n" + str(dict(failed.headers)))
    sinks.add("JSON log lines", "\n".join(json_lines.lines()))
    sinks.add(
        "error-report e-mail",
        "\n".join(
            [str(report.subject), str(report.body)]
            + [str(content) for content, _ in getattr(report, "alternatives", [])]
        ),
    )
    sinks.add("PostgreSQL server log", server_log.appended())
    assert "Internal Server Error" in report.subject
    assert "QUERY_STRING" in report.body and "[email:hm_" in report.body  # redacted
    assert sinks.hits(c) == []
