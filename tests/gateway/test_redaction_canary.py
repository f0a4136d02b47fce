"""The redaction canary (issue 9 §4, docs/redaction.md): secrets and personal data
planted in everything an agent or a person controls never reach a sink.

Canaries (fresh random values each run, one per detector family) go into task
fields, operation input, field values, headers, transition payloads, a takeover
note, an outcome reference and result, and through the ticket desk's answers (it
echoes the body, and names an unknown member in its error). A real flow runs: the
agent API over HTTP, the gateway against the ticket desk, a person's takeover, a
reviewer's CSV and JSON exports. Then every column of every table (read as text),
the outbox payloads, every API response, the admin pages a reviewer and the support
person see, the exports and the captured logs are searched for each canary, as is,
JSON-escaped, URL-encoded and base64-encoded. The desk, the one place the real
values must arrive, is checked to have them.

The declared personal field (a customer's name) is planted under its declared key
and in the text beside it in the same input; a name in a free-text note elsewhere
is not detected (docs/redaction.md, "What is not detected"), so it is not planted
there.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import string
import time
import urllib.parse
from typing import Any, cast

import httpx
import pytest
from detect_secrets.plugins.high_entropy_strings import (
    Base64HighEntropyString,
    HexHighEntropyString,
)
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import DataError, connection
from django.test import Client
from django.urls import NoReverseMatch, reverse

from audit import jobs as audit_jobs
from audit.models import Outbox, OutboxState
from portal import services as portal_services
from portal.db import db_now
from portal.models import Role
from tasks import services as task_services
from tasks.models import Operation, OperationState, Task, TaskState
from tests.gateway.conftest import World, minutes_ago
from tests.support.broker import Tap
from tests.support.contracts import SPEC, TARGET
from tests.support.db import ServerLog


def _rand(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"


def _luhn_card(prefix: str = "5") -> str:
    digits = [int(c) for c in prefix + _rand(string.digits, 15 - len(prefix))]
    total = 0
    for index, digit in enumerate(reversed(digits)):
        if index % 2 == 0:
            digit *= 2
            digit -= 9 if digit > 9 else 0
        total += digit
    check = (10 - total % 10) % 10
    number = "".join(map(str, digits)) + str(check)
    return " ".join(number[i : i + 4] for i in range(0, 16, 4))


def _high_entropy(alphabet: str, n: int, plugin: Any) -> str:
    """A random string above the detector's entropy limit (S10's canary corpus:
    base64 at 4.5 bits or more, hex at 3.0 or more)."""
    while True:
        value = _rand(alphabet, n)
        if plugin.calculate_shannon_entropy(value) > plugin.entropy_limit + 0.1:
            return value


def _canaries() -> dict[str, str]:
    """name -> the value as planted."""
    user = _rand(string.ascii_lowercase, 8)
    return {
        "email": f"canary.{user}@example.org",
        "card": _luhn_card(),
        "person": f"Canary {_rand(string.ascii_uppercase, 6)} Person",
        "github": "ghp_" + _rand(ALNUM, 36),
        "aws": "AKIA" + _rand(string.ascii_uppercase + string.digits, 16),
        "stripe": "sk_live_" + _rand(ALNUM, 24),
        "slack": "xoxb-" + _rand(string.digits, 12) + "-" + _rand(ALNUM, 24),
        "jwt": ".".join(
            [
                "eyJhbGciOiJIUzI1NiJ9",
                base64.urlsafe_b64encode(json.dumps({"sub": _rand(ALNUM, 12)}).encode())
                .decode()
                .rstrip("="),
                _rand(B64URL, 43),
            ]
        ),
        "pem_body": _rand(ALNUM + "+/", 64),
        "pg_password": "Pg" + _rand(ALNUM, 18),
        "base64": _high_entropy(ALNUM + "+/", 40, Base64HighEntropyString()),
        "hex": _high_entropy("0123456789abcdef", 40, HexHighEntropyString()),
        "basic": base64.b64encode(f"admin:{_rand(ALNUM, 16)}".encode()).decode(),
        "bearer": _rand(ALNUM, 32),
        "password": "pw-" + _rand(ALNUM, 20),
        "agent_key": f"agp_{_rand('0123456789abcdef', 12)}.{_rand(B64URL, 32)}",
        "signing_key": _high_entropy(ALNUM, 40, Base64HighEntropyString()),
    }


def _variants(value: str) -> set[str]:
    return {
        value,
        json.dumps(value)[1:-1],
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote_plus(value),
        base64.b64encode(value.encode()).decode().rstrip("="),
    }


def _note(c: dict[str, str]) -> str:
    """Free text as a person or agent writes it, every canary in it."""
    return (
        f"Customer {c['email']} paid with {c['card']}. "
        f"Pushed with {c['github']}, aws {c['aws']}, stripe {c['stripe']}, "
        f"slack {c['slack']}, jwt {c['jwt']}, "
        f"dsn postgres://app:{c['pg_password']}@db.internal:5432/x, "
        f"key {c['base64']} hex {c['hex']}, Authorization: Basic {c['basic']}, "
        f'Authorization: Bearer {c["bearer"]}, password = "{c["password"]}", '
        f"agent {c['agent_key']}, "
        f"-----BEGIN PRIVATE KEY-----\n{c['pem_body']}\n-----END PRIVATE KEY-----"
    )


def _nested(c: dict[str, str]) -> dict[str, Any]:
    """A structured payload: canaries under innocent and telling keys alike."""
    return {
        "note": _note(c),
        "auth_header": f"Basic {c['basic']}",
        "headers": {"Authorization": f"Bearer {c['bearer']}", "X-Key": c["github"]},
        "config": {
            "connector": c["signing_key"],
            "dsn": f"postgres://app:{c['pg_password']}@db.internal:5432/x",
        },
        "password": c["password"],
        "card_number": c["card"].replace(" ", ""),
        "amount_card": int(c["card"].replace(" ", "")),
        "list": [c["email"], {"deep": c["aws"]}],
        "prompt": f"You are an agent. Secret {c['stripe']}",
    }


class Sinks:
    """Everything read back, by sink name."""

    def __init__(self) -> None:
        self.texts: dict[str, list[str]] = {}

    def add(self, sink: str, text: str) -> None:
        self.texts.setdefault(sink, []).append(text)

    def hits(self, canaries: dict[str, str]) -> list[tuple[str, str]]:
        found = []
        for sink, texts in self.texts.items():
            blob = "\n".join(texts)
            for name, value in canaries.items():
                if any(variant in blob for variant in _variants(value)):
                    found.append((sink, name))
        return found


def _every_table_as_text() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT table_name FROM information_schema.tables
            WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'
            ORDER BY table_name
            """
        )
        tables = [row[0] for row in cursor.fetchall()]
        out = {}
        for table in tables:
            cursor.execute(f'SELECT t::text FROM "{table}" AS t')
            out[table] = "\n".join(row[0] for row in cursor.fetchall())
    return out


def _person(name: str, tenant: Any, role: Role) -> User:
    user = User.objects.create_user(name, password="pw-canary", is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=user, role=role)
    return user


def _admin_pages(client: Client, tenant: Any) -> list[tuple[str, int, str]]:
    """Every admin changelist, and the change page of each of the tenant's rows."""
    pages = [("/admin/", client.get("/admin/"))]
    for model in admin.site._registry:
        opts = model._meta
        try:
            changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        except NoReverseMatch:
            continue
        pages.append((changelist, client.get(changelist)))
        field_names = {f.name for f in opts.get_fields()}
        if "tenant" in field_names:
            rows = model._default_manager.filter(tenant=tenant)
        elif opts.model_name == "tenant":
            rows = model._default_manager.filter(pk=tenant.pk)
        else:
            continue
        for pk in rows.order_by("pk").values_list("pk", flat=True)[:30]:
            change = reverse(
                f"admin:{opts.app_label}_{opts.model_name}_change", args=[pk]
            )
            pages.append((change, client.get(change, follow=True)))
    return [
        (url, response.status_code, response.content.decode(errors="replace"))
        for url, response in pages
    ]


def _broker_message(message: Any) -> str:
    """A tapped message as text: where it went, its headers, properties and body."""
    body = message.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    return "\n".join(
        [
            json.dumps(message.delivery_info, default=str),
            json.dumps(message.headers, default=str, ensure_ascii=False),
            json.dumps(message.properties, default=str, ensure_ascii=False),
            body,
        ]
    )


def _run_on_a_celery_worker(operation_id: str, timeout: float = 60) -> None:
    """Start an embedded Celery worker (solo pool, a thread of this process) on the
    test's queue and let it take the messages the API and the commits sent (the
    queued execution's job, the relay nudges) until the operation is settled."""
    from celery.contrib.testing.worker import start_worker

    from config.celery import app

    conf: Any = app.conf
    hijack = conf.worker_hijack_root_logger
    conf.worker_hijack_root_logger = False  # the test's log capture stays attached
    try:
        with start_worker(
            cast(Any, app),
            pool="solo",
            perform_ping_check=False,
            loglevel="INFO",
            shutdown_timeout=60,
        ):
            deadline = time.monotonic() + timeout
            while Operation.objects.get(pk=operation_id).state in (
                OperationState.RESERVED,
                OperationState.EXECUTING,
            ):
                assert time.monotonic() < deadline, "the worker did not run the job"
                time.sleep(0.1)
    finally:
        conf.worker_hijack_root_logger = hijack


@pytest.mark.timeout(300)
def test_no_canary_reaches_any_sink(
    world: World,
    caplog: pytest.LogCaptureFixture,
    amqp_url: str,
    events_exchange: str,
    celery_test_queue: str,
):
    caplog.set_level(logging.DEBUG)
    c = _canaries()
    sinks = Sinks()
    # a copy of the messages the portal sends: events, and (peeked) Celery jobs
    tap = Tap(url=amqp_url, events=events_exchange).declare()
    server_log = ServerLog()  # what PostgreSQL logs from here on
    responses: list[httpx.Response] = []

    def keep(response: httpx.Response) -> None:
        response.read()
        responses.append(response)

    world.http.event_hooks["response"] = [keep]
    # every request carries canaries in headers the portal does not need
    world.http.headers.update(
        {"X-Debug-Token": c["github"], "User-Agent": f"agent/1 {c['aws']}"}
    )
    tenant = world.tenant
    # a contract that declares the customer's name and e-mail personal
    task_services.contract_create(
        tenant=tenant,
        key="canary-issue",
        spec={
            **SPEC,
            "sensitive_fields": {"customer": "personal", "email": "personal"},
        },
        publish=True,
    )
    portal_services.agent_grant(agent=world.agent, action="send_note", target="notes")

    def register(n: int, **overrides: str) -> httpx.Response:
        return world.http.post(
            "/api/v1/tasks",
            json={
                "client_task_id": f"canary-{n}",
                "workflow_key": "customer-issue",
                "workflow_version": "1",
                "object_type": "customer_issue",
                "object_id": f"c-{n}",
                "object_version": "7",
                "contract_key": "canary-issue",
                **overrides,
            },
        )

    def running(n: int) -> tuple[dict[str, Any], int]:
        task = register(n).json()
        task_services.object_version_record(
            tenant=tenant, object_type="customer_issue", object_id=f"c-{n}", version="7"
        )
        leased = world.http.post(
            f"/api/v1/tasks/{task['id']}/lease",
            json={"owner": f"worker-{n}"},
            headers={"Idempotency-Key": c["stripe"] + str(n)},
        ).json()
        token = leased["lease"]["token"]
        moved = world.http.post(
            f"/api/v1/tasks/{task['id']}/transitions",
            json={
                "to": "running",
                "expected_state_version": leased["state_version"],
                "payload": _nested(c),
            },
            headers={"Lease-Token": str(token)},
        )
        assert moved.status_code == 200, moved.text
        return task, token

    def reserve(task: dict[str, Any], token: int, key: str, **input: Any) -> str:
        reserved = world.http.post(
            f"/api/v1/tasks/{task['id']}/operations",
            json={
                "idempotency_key": key,
                "action": input.pop("action", "create_ticket"),
                "target": input.pop("target", TARGET),
                "input": input,
            },
            headers={"Lease-Token": str(token), "Idempotency-Key": c["slack"] + key},
        )
        assert reserved.status_code == 201, reserved.text
        return reserved.json()["id"]

    def fields(observed_at: str | None = None) -> list[dict[str, Any]]:
        at = observed_at or db_now().isoformat()
        return [
            {"name": "email", "value": c["email"], "source": "crm", "observed_at": at},
            {"name": "plan", "value": "pro", "source": "billing", "observed_at": at},
        ]

    # 1. identifiers that carry a secret or personal data are refused, unnamed
    for field, value in [
        ("client_task_id", f"task-{c['email']}"),
        ("object_id", c["card"]),
        ("object_version", c["github"]),
    ]:
        refused = register(99, **{field: value})
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "SENSITIVE_VALUE"

    # 2. the happy path: canaries in the input, the fields, the payloads, headers
    spare = register(5).json()
    refused_owner = world.http.post(
        f"/api/v1/tasks/{spare['id']}/lease", json={"owner": c["email"]}
    )
    assert refused_owner.status_code == 422, refused_owner.text
    task, token = running(1)
    operation_id = reserve(
        task,
        token,
        "canary-op-1",
        queue="billing",
        summary=f"Refund for {c['person']}. " + _note(c)[:900],
        customer=c["person"],
    )
    executed = world.http.post(
        f"/api/v1/operations/{operation_id}/execute",
        json={"field_values": fields()},
        headers={"Lease-Token": str(token)},
    )
    assert executed.status_code == 200, executed.text
    assert executed.json()["outcome"] == "verified"
    verified = Operation.objects.get(pk=operation_id)
    assert verified.state == OperationState.VERIFIED and verified.sealed is None

    # 3. the remote refuses, naming the unknown member (a canary) in its answer
    task2, token2 = running(2)
    failed_id = reserve(
        task2,
        token2,
        "canary-op-2",
        queue="billing",
        summary="refund",
        **{f"x{c['hex']}": c["email"]},
    )
    rejected = world.http.post(
        f"/api/v1/operations/{failed_id}/execute",
        json={"field_values": fields()},
        headers={"Lease-Token": str(token2)},
    )
    assert rejected.json()["outcome"] == "failed", rejected.text

    # 4. stale fields: a person takes over and writes a note full of canaries
    task3, token3 = running(3)
    stale_id = reserve(
        task3, token3, "canary-op-3", queue="billing", summary="x", customer="y"
    )
    escalated = world.http.post(
        f"/api/v1/operations/{stale_id}/execute",
        json={"field_values": fields(observed_at=minutes_ago(60))},
        headers={"Lease-Token": str(token3)},
    )
    assert escalated.status_code == 422, escalated.text
    assert escalated.json()["code"] == "FIELD_STALE"
    support = _person("canary-support", tenant, Role.SUPPORT)
    desk = Client()
    desk.force_login(support)
    staff_responses = [
        desk.post(f"/api/v1/takeover/tasks/{task3['id']}/claim"),
        desk.post(
            f"/api/v1/takeover/tasks/{task3['id']}/resolve",
            {"resolution": "fail", "operation_id": stale_id, "note": _note(c)[:1900]},
            content_type="application/json",
        ),
    ]
    assert [r.status_code for r in staff_responses] == [200, 200], [
        r.content for r in staff_responses
    ]
    assert Task.objects.get(pk=task3["id"]).state == TaskState.FAILED

    # 5. an agent's own call (no connector): an outcome reference and result
    task4, token4 = running(4)
    note_id = reserve(
        task4, token4, "canary-op-4", action="send_note", target="notes", text="hi"
    )
    started = world.http.post(
        f"/api/v1/operations/{note_id}/start", headers={"Lease-Token": str(token4)}
    )
    assert started.status_code == 200, started.text
    refused_ref = world.http.post(
        f"/api/v1/operations/{note_id}/outcome",
        json={"outcome": "verified", "provider_reference": c["github"]},
        headers={"Lease-Token": str(token4)},
    )
    assert refused_ref.status_code == 422, refused_ref.text
    reported = world.http.post(
        f"/api/v1/operations/{note_id}/outcome",
        json={
            "outcome": "verified",
            "provider_reference": "note-1",
            "result": {**_nested(c), "provider_response": {"echo": _note(c)}},
        },
        headers={"Lease-Token": str(token4)},
    )
    assert reported.status_code == 200, reported.text

    # the real values did reach the remote system (the one place they must go)
    tickets = [t for t in world.desk.tickets() if t["tenant"] == str(tenant.pk)]
    assert len(tickets) == 1
    assert tickets[0]["fields"] == {"email": c["email"]}
    assert tickets[0]["customer"] == c["person"]
    assert c["github"] in tickets[0]["summary"]
    # and operations still match by the keyed hash of a value (no value stored)
    assert (
        Operation.objects.filter(
            tenant=tenant, call_fields__icontains=c["email"]
        ).count()
        == 0
    )

    # 6. a queued execution: its job goes through RabbitMQ to a Celery worker, and
    # the commits' nudges run the outbox relay there (events to the exchange)
    task6, token6 = running(6)
    queued_id = reserve(
        task6,
        token6,
        "canary-op-6",
        queue="billing",
        summary=f"Refund for {c['person']}. " + _note(c)[:900],
        customer=c["person"],
    )
    queued = world.http.post(
        f"/api/v1/operations/{queued_id}/execute",
        json={"field_values": fields()},
        headers={"Lease-Token": str(token6), "Prefer": "respond-async"},
    )
    assert queued.status_code == 202, queued.text
    assert tap.peek(celery_test_queue) >= 1  # the job (and nudges), left in place
    _run_on_a_celery_worker(queued_id)
    assert Operation.objects.get(pk=queued_id).state == OperationState.VERIFIED

    # 7. read everything back: API reads, exports, admin pages
    for path in (
        f"/api/v1/tasks/{task['id']}",
        f"/api/v1/tasks/{task['id']}/events",
        f"/api/v1/tasks/{task3['id']}/events",
        f"/api/v1/tasks/{task4['id']}/events",
        f"/api/v1/operations/{operation_id}",
        f"/api/v1/operations/{failed_id}",
        f"/api/v1/operations/{note_id}",
        "/api/v1/tasks",
    ):
        assert world.http.get(path).status_code == 200
    reviewer = _person("canary-reviewer", tenant, Role.REVIEWER)
    reading = Client()
    reading.force_login(reviewer)
    for kind in ("csv", "jsonl"):
        export = reading.get(f"/admin/audit/event/export/{kind}/")
        assert export.status_code == 200
        body = b"".join(export.streaming_content).decode()  # type: ignore[attr-defined]
        assert str(task["id"]) in body
        sinks.add(f"export {kind}", body)
    for who, client in (("reviewer", reading), ("support", desk)):
        for url, status, html in _admin_pages(client, tenant):
            assert status in (200, 403, 404), (who, url, status)
            sinks.add(f"admin as {who}", f"{url}\n{html}")
    # searching the redacted trail for a canary finds nothing (no search oracle)...
    for name in ("email", "github", "person"):
        for changelist in ("/admin/audit/event/", "/admin/tasks/operation/"):
            page = reading.get(changelist, {"q": c[name]}).content.decode()
            assert str(operation_id) not in page, (name, changelist)
            assert "0 results" in page or "0 events" in page or "0 operations" in page
            # the search box shows the person's own term back: not a stored value
            for variant in _variants(c[name]):
                page = page.replace(variant, "")
            sinks.add("admin search", page)
    # ...while the keyed hash finds the operation that carried the e-mail address
    found = reading.get("/admin/tasks/operation/", {"q": f"value:{c['email']}"})
    assert (
        verified.pk.hex[:8] in found.content.decode()
        or str(verified.pk) in found.content.decode()
    )
    page = found.content.decode()
    for variant in _variants(c["email"]):
        page = page.replace(variant, "")  # the search box shows the term back
    sinks.add("admin search", page)

    for kept in responses:
        sinks.add("API responses", f"{kept.url}\n{kept.text}")
    for staff_response in staff_responses:
        sinks.add("API responses", staff_response.content.decode())
    tables = _every_table_as_text()
    assert "canary-1" in tables["tasks_task"]  # the scan reads the rows
    for table, text in tables.items():
        sinks.add(f"table {table}", text)
    for payload in Outbox.objects.filter(tenant=tenant).values_list(
        "payload", flat=True
    ):
        sinks.add("outbox payloads", json.dumps(payload, ensure_ascii=False))
    assert Outbox.objects.filter(tenant=tenant).count() > 10
    # the broker: a relay pass publishes what the worker's runs left (rows written
    # since, e.g. the exports' events); every message the tap copied is read
    audit_jobs.relay_outbox_job()
    tapped = tap.drain()
    tap.delete()
    jobs = {m.headers.get("task") for m in tapped if "task" in (m.headers or {})}
    events = [m for m in tapped if m.delivery_info["exchange"] == events_exchange]
    assert "tasks.jobs.run_operation_job" in jobs, [m.delivery_info for m in tapped]
    sent = Outbox.objects.filter(state=OutboxState.SENT).count()
    assert sent == Outbox.objects.count() and len(events) == sent, (sent, len(events))
    for message in tapped:
        sinks.add("broker messages", _broker_message(message))
    # the PostgreSQL server log: the scan reads what the server wrote (a probe's
    # refused cast names its value there), then looks for the canaries
    probe = "canary-log-probe-" + _rand(ALNUM, 12)
    with pytest.raises(DataError), connection.cursor() as cursor:
        cursor.execute("SELECT %s::integer", [probe])
    logged = server_log.appended()
    assert probe in logged, f"{server_log.path} did not show the probe"
    sinks.add("PostgreSQL server log", logged)
    sinks.add("logs", caplog.text)
    sinks.add("logs", "\n".join(str(r.args) for r in caplog.records))

    # then: no canary in any sink, in any encoding
    assert sinks.hits(c) == []
