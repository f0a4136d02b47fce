"""A real SMTP server and a real webhook receiver on 127.0.0.1 for routing's tests,
and a tenant whose desk items go to a group with members and a webhook."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from portal import services as portal_services
from portal.actors import Actor
from portal.models import Role, Tenant
from routing import services as routing_services
from routing.models import Group, RoutingRule, Webhook
from tasks import escalation
from tasks.models import Escalation, Task, TaskState
from tests.support import broker
from tests.support import outbound as outbound_support
from tests.support.smtp import Inbox, smtp  # noqa: F401 (the fixture, for routing's tests)

# Planted in the task, its operation's arguments and the evidence: it must never
# reach the SMTP server or the webhook receiver.
CANARY = "canary-7f3a9c1e-do-not-leak"
CUSTOMER_EMAIL = "ana.customer@example.com"


@dataclass
class Receiver:
    """A webhook receiver that checks the signature; ``fail_next`` answers 500."""

    url: str = ""
    secret: str = ""
    fail_next: int = 0
    posts: list[dict[str, Any]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, headers: Any, body: bytes) -> int:
        with self.lock:
            if self.fail_next:
                self.fail_next -= 1
                return 500
            timestamp = headers["X-Portal-Timestamp"]
            expected = hmac.new(
                self.secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256
            ).hexdigest()
            valid = hmac.compare_digest(
                headers["X-Portal-Signature"], "sha256=" + expected
            )
            self.raw.append(body)
            self.posts.append(
                {
                    "valid": valid,
                    "delivery": headers["X-Portal-Delivery"],
                    "body": json.loads(body),
                }
            )
            return 200 if valid else 401


@pytest.fixture
def receiver(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = state.handle(self.headers, body)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_port}/hooks/desk"
    outbound_support.allow(settings, monkeypatch, state.url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Desk:
    tenant: Tenant
    group: Group
    backup: Group
    rule: RoutingRule
    webhook: Webhook
    members: dict[str, User]


@pytest.fixture
def desk(tenant: Tenant, receiver: Receiver) -> Desk:
    """FIELD_STALE items go to Billing (remind 60 s, escalate 300 s, then On-call);
    Ana wants e-mail, Bo does not, Cy is on call; one webhook for the tenant."""
    from routing import delivery

    billing = Group.objects.create(tenant=tenant, name="Billing")
    on_call = Group.objects.create(tenant=tenant, name="On-call")
    rule = RoutingRule.objects.create(
        tenant=tenant,
        reason_code="FIELD_STALE",
        group=billing,
        backup_group=on_call,
        remind_after_s=60,
        escalate_after_s=300,
    )
    members = {}
    for name, group, wants in (
        ("ana", billing, True),
        ("bo", billing, False),
        ("cy", on_call, True),
    ):
        user = User.objects.create_user(
            name, email=f"{name}@support.example", is_staff=True
        )
        portal_services.membership_grant(tenant=tenant, user=user, role=Role.SUPPORT)
        routing_services.group_member_add(
            tenant=tenant, group=group, user=user, email_enabled=wants
        )
        members[name] = user
    webhook = Webhook.objects.create(tenant=tenant, url=receiver.url)
    receiver.secret = delivery.webhook_secret(webhook=webhook)
    return Desk(
        tenant=tenant,
        group=billing,
        backup=on_call,
        rule=rule,
        webhook=webhook,
        members=members,
    )


def escalate_with_canary(
    make_task: Any, make_operation: Any, tenant: Tenant, reason: str = "FIELD_STALE"
) -> tuple[Task, Escalation]:
    """A running task whose fields and arguments hold the canary, handed to a person."""
    task = make_task(
        tenant=tenant,
        state=TaskState.RUNNING,
        leased=True,
        client_task_id=f"issue-{CANARY}-{uuid.uuid4().hex[:8]}",
        object_id=CANARY,
    )
    operation = make_operation(
        task=task,
        input={"summary": f"refund {CANARY}", "email": CUSTOMER_EMAIL},
        call_fields={"email": CUSTOMER_EMAIL, "note": CANARY},
    )
    with transaction.atomic():
        record = escalation.escalate(
            tenant=tenant,
            task=task,
            operation=operation,
            reason=reason,  # type: ignore[arg-type]
            evidence={"fields": {"email": CUSTOMER_EMAIL, "note": CANARY}},
            actor=Actor.system("test"),
        )
    return task, record


# The shared broker fixtures (tests/support/broker.py), for the real worker's test.
amqp_url = broker.amqp_url
celery_test_queue = broker.celery_test_queue
