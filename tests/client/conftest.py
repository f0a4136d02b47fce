"""Fixtures for the client tests: a real portal over HTTP on 127.0.0.1.

pytest-django's ``live_server`` is a threaded WSGI server in this process on the test
database; it pulls in ``transactional_db``, so rows committed by a test are visible
to the server's threads and the other way round.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from pytest_django.live_server_helper import LiveServer

from portal import services as portal_services
from portal.models import Agent, Tenant
from portal_client import PortalClient
from ticketdesk.harness import TicketDesk

_counter = itertools.count(1)


@dataclass(frozen=True, kw_only=True)
class AgentIdentity:
    tenant: Tenant
    agent: Agent
    secret: str


@pytest.fixture
def portal_url(live_server: LiveServer) -> str:
    # The server binds IPv4; "localhost" could try ::1 first.
    return f"http://127.0.0.1:{live_server.thread.port}"


@pytest.fixture
def identity(live_server: LiveServer) -> AgentIdentity:
    """A tenant with one agent allowed to create tickets anywhere, and its key."""
    n = next(_counter)
    tenant = portal_services.tenant_create(slug=f"client-{n}", name=f"Client {n}")
    agent = portal_services.agent_create(tenant=tenant, name="client-agent")
    portal_services.agent_grant(agent=agent, action="create_ticket", target="*")
    issued = portal_services.agent_key_issue(agent=agent)
    return AgentIdentity(tenant=tenant, agent=agent, secret=issued.secret)


class FaultyTransport(httpx.BaseTransport):
    """The real HTTP transport, recording every exchange, with faults on demand.

    ``drop_answer(request)`` true: the request reaches the portal and is processed,
    then the answer is thrown away and the client sees a connection reset (once).
    ``before_send(request)``: runs before the first forwarded request (once).
    ``fake_answer(request)``: answer this instead of forwarding (once).
    """

    def __init__(
        self,
        *,
        drop_answer: Callable[[httpx.Request], bool] | None = None,
        before_send: Callable[[httpx.Request], None] | None = None,
        fake_answer: Callable[[httpx.Request], httpx.Response | None] | None = None,
    ) -> None:
        self.inner = httpx.HTTPTransport()
        self.drop_answer = drop_answer
        self.before_send = before_send
        self.fake_answer = fake_answer
        self.requests: list[httpx.Request] = []
        self.responses: list[httpx.Response | None] = []  # None: dropped

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.fake_answer is not None:
            fake, self.fake_answer = self.fake_answer(request), None
            if fake is not None:
                self.responses.append(fake)
                return fake
        if self.before_send is not None:
            hook, self.before_send = self.before_send, None
            hook(request)
        response = self.inner.handle_request(request)
        response.read()
        if self.drop_answer is not None and self.drop_answer(request):
            self.drop_answer = None
            response.close()
            self.responses.append(None)
            raise httpx.ReadError("connection reset after the answer", request=request)
        self.responses.append(response)
        return response

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def make_client(
    portal_url: str, identity: AgentIdentity
) -> Iterator[Callable[..., PortalClient]]:
    """Clients for the fixture's agent (closed after the test); kwargs go through."""
    clients: list[PortalClient] = []

    def make(**kwargs: Any) -> PortalClient:
        options: dict[str, Any] = {"timeout": 10.0, "backoff_s": 0.05, **kwargs}
        client = PortalClient(portal_url, identity.secret, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def api(make_client: Callable[..., PortalClient]) -> PortalClient:
    """A client of the fixture's agent (``client`` stays pytest-django's)."""
    return make_client()


@dataclass(frozen=True, kw_only=True)
class Demo:
    """What ``manage.py seed_demo`` made: the demo tenant and its agent's key."""

    tenant: Tenant
    secret: str
    output: str


@pytest.fixture
def demo(live_server: LiveServer, desk: TicketDesk) -> Demo:
    """The demo world, seeded by the real command against the real desk."""
    out = io.StringIO()
    call_command(
        "seed_demo",
        "--ticketdesk-url",
        desk.url,
        "--ticketdesk-keys",
        str(desk.keys_path),
        stdout=out,
    )
    match = re.search(
        r"issued a new API key for '[^']+': (\S+) \(shown once\)", out.getvalue()
    )
    assert match, out.getvalue()
    return Demo(
        tenant=Tenant.objects.get(slug="demo"), secret=match[1], output=out.getvalue()
    )
