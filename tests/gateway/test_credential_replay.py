"""A captured gateway credential buys nothing (issue 10 §2, credential replay).

An eavesdropper sits between the gateway and the real ticket desk (a forwarding
HTTP proxy on 127.0.0.1) and keeps every request the gateway sends. Replaying a
captured credential, as sent or altered, is refused by the desk; the portal revokes
each credential once its call is recorded and tells the desk about those it may not
have seen. The normal flow still makes exactly one ticket.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from django.db import transaction

from portal.db import db_now
from portal.tracing import NO_TRACE
from tasks.credentials import request_body
from tasks.gateway import revocation
from tasks.gateway.call import issue_credential
from tasks.gateway.common import SYSTEM
from tasks.models import Connector, Credential, Operation, Task
from tests.support.outbound import allow as outbound_allow
from ticketdesk.harness import TicketDesk

from .conftest import World


@dataclass(frozen=True)
class Captured:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Wiretap(ThreadingHTTPServer):
    """Forwards every request to the desk and keeps a copy of it."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.captured: list[Captured] = []
        super().__init__(("127.0.0.1", 0), _Forward)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def creates(self) -> list[Captured]:
        return [c for c in self.captured if (c.method, c.path) == ("POST", "/tickets")]


class _Forward(BaseHTTPRequestHandler):
    server: Wiretap

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() in ("authorization", "idempotency-key", "content-type")
        }
        self.server.captured.append(Captured(self.command, self.path, headers, body))
        answer = httpx.request(
            self.command,
            self.server.upstream + self.path,
            headers=headers,
            content=body,
            timeout=10,
        )
        self.send_response(answer.status_code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = _forward

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def wiretap(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Wiretap]:
    tap = Wiretap(world.desk.url)
    thread = threading.Thread(target=tap.serve_forever, daemon=True)
    thread.start()
    outbound_allow(settings, monkeypatch, tap.url)  # another port of 127.0.0.1
    Connector.objects.filter(pk=world.connector.pk).update(base_url=tap.url)
    yield tap
    tap.shutdown()
    tap.server_close()


def replay(
    desk: TicketDesk,
    captured: Captured,
    *,
    key: str | None = None,
    body: bytes | None = None,
) -> httpx.Response:
    """Send a captured create again, straight to the desk, perhaps altered."""
    headers = dict(captured.headers)
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(
        f"{desk.url}/tickets",
        headers=headers,
        content=captured.body if body is None else body,
    )


def without_object(captured: Captured) -> bytes:
    sent = httpx.Response(200, content=captured.body).json()
    sent.pop("object")
    return request_body(sent)


def test_the_normal_flow_makes_one_ticket_and_revokes_its_credentials(
    world: World, wiretap: Wiretap
):
    started = world.start_task()

    body = world.execute(started).json()

    assert body["outcome"] == "verified"
    assert world.tickets() == 1
    assert len(wiretap.creates()) == 1
    operation = Operation.objects.get(pk=started["operation"]["id"])
    credentials = Credential.objects.filter(operation=operation)
    assert credentials.count() == 2  # the call's, and its confirming lookup's
    assert all(c.revoked_at is not None for c in credentials)


@pytest.mark.parametrize(
    "alteration",
    [
        "as-captured",
        "new-key",
        "new-key-without-object",  # the attack of issue 10 §2
        "same-key-without-object",
        "other-fields",
        "other-object",
    ],
)
def test_a_captured_credential_makes_no_second_ticket(
    world: World, wiretap: Wiretap, alteration: str
):
    started = world.start_task()
    world.execute(started)
    (captured,) = wiretap.creates()
    sent = httpx.Response(200, content=captured.body).json()

    alterations: dict[str, dict[str, Any]] = {
        "as-captured": {},
        "new-key": {"key": "attacker-key-1"},
        "new-key-without-object": {
            "key": "attacker-key-2",
            "body": without_object(captured),
        },
        "same-key-without-object": {"body": without_object(captured)},
        "other-fields": {
            "body": request_body(sent | {"fields": {"email": "eve@example.com"}})
        },
        "other-object": {
            "body": request_body(
                sent | {"object": {"type": "customer_issue", "id": "9999"}}
            )
        },
    }
    answer = replay(world.desk, captured, **alterations[alteration])

    # As captured, the jti is spent; altered, the token is not for this request.
    expected = (
        (401, "credential_replayed")
        if alteration == "as-captured"
        else (403, "credential_scope")
    )
    assert (answer.status_code, answer.json()["error"]) == expected, answer.text
    assert world.tickets() == 1


def test_a_credential_the_desk_never_saw_is_revoked_there_after_the_call(
    world: World, wiretap: Wiretap
):
    """The desk failed before reading the credential (a 503): the portal revokes it
    when it records the call and tells the desk, so a copy is refused."""
    started = world.start_task()
    world.desk.set_fault("error_5xx")

    world.execute(started)

    first = wiretap.creates()[0]
    answer = replay(world.desk, first)
    assert (answer.status_code, answer.json()["error"]) == (401, "credential_revoked")
    assert world.tickets() == 1  # recovery's retry under the same key made it
    assert any(c.path == "/credentials/revocations" for c in wiretap.captured)


def _issue(world: World, ttl_s: int) -> tuple[str, Credential, bytes]:
    """A credential for the task's operation, issued by the gateway's own function."""
    started = world.start_task()
    operation = Operation.objects.get(pk=started["operation"]["id"])
    task = Task.objects.get(pk=started["task"]["id"])
    body = request_body(
        {
            "queue": "billing",
            "summary": "Refund",
            "object": {"type": task.object_type, "id": task.object_id},
            "fields": {},
        }
    )
    with transaction.atomic():
        token, credential = issue_credential(
            tenant=world.tenant,
            task=task,
            operation=operation,
            connector=world.connector,
            ttl_s=ttl_s,
            field_names=[],
            action=operation.action,
            now=db_now(),
            actor=SYSTEM,
            trace=NO_TRACE,
            body=body,
        )
    return token, credential, body


def _send(world: World, token: str, credential: Credential, body: bytes) -> Any:
    key = Operation.objects.get(pk=credential.operation_id).idempotency_key
    return httpx.post(
        f"{world.desk.url}/tickets",
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key},
        content=body,
    )


def test_a_credential_revoked_in_the_portal_is_refused_by_the_desk(world: World):
    token, credential, body = _issue(world, ttl_s=60)

    taken = revocation.credential_revoke(
        tenant=world.tenant, credential_ids=[credential.pk]
    )
    answer = _send(world, token, credential, body)

    assert taken == {"ticket-desk": True}
    credential.refresh_from_db()
    assert credential.revoked_at is not None
    assert (answer.status_code, answer.json()["error"]) == (401, "credential_revoked")
    assert world.tickets() == 0


def test_an_expired_credential_is_refused_by_the_desk(world: World):
    token, credential, body = _issue(world, ttl_s=1)
    time.sleep(max(0.0, credential.expires_at.timestamp() - time.time()) + 0.2)

    answer = _send(world, token, credential, body)

    assert (answer.status_code, answer.json()["error"]) == (401, "credential_expired")
    assert world.tickets() == 0


def test_the_same_credential_issued_fresh_works_once(world: World):
    """The control for the two tests above: unrevoked and in time, it is accepted."""
    token, credential, body = _issue(world, ttl_s=60)

    first = _send(world, token, credential, body)
    second = _send(world, token, credential, body)

    assert first.status_code == 201, first.text
    assert (second.status_code, second.json()["error"]) == (401, "credential_replayed")
    assert world.tickets() == 1


def _wait_for_answers(world: World, offset: int, request: str, count: int) -> None:
    """Wait until the desk has logged ``count`` answers to ``request`` past
    ``offset`` of its request log (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        with world.desk.log_path.open("rb") as log:
            log.seek(offset)
            answered = log.read().decode(errors="replace").count(request)
        if answered >= count:
            return
        assert time.monotonic() < deadline, f"{answered} of {count} {request} answers"
        time.sleep(0.1)


def test_recovery_retries_with_a_fresh_credential_and_the_late_first_is_void(
    world: World,
):
    """The first call outlives the read timeout; recovery looks (none yet), retries
    under the same key with a fresh credential and gets the ticket; the first
    request, arriving late at the desk, finds its credential revoked: one ticket."""
    started = world.start_task()
    world.desk.set_fault("slow", delay_s=3.0)  # longer than the 2 s read timeout
    log_from = world.desk.log_path.stat().st_size

    body = world.execute(started).json()
    # The slow first request wakes up on the desk and is answered (logged) after
    # the retry's: two ticket requests in the desk's log.
    _wait_for_answers(world, log_from, '"POST /tickets HTTP/1.1"', 2)

    assert body["outcome"] == "verified", body
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert operation.attempts == 2
    execute_credentials = [
        c for c in Credential.objects.filter(operation=operation) if c.fields
    ]
    assert len({c.pk for c in execute_credentials}) == 2  # a fresh one for the retry
    assert all(c.revoked_at is not None for c in execute_credentials)
    assert world.tickets() == 1
    [ticket] = world.desk.tickets()
    assert ticket["receipt"]["credential_jti"] == str(
        max(execute_credentials, key=lambda c: c.issued_at).pk
    )
