"""A real gunicorn on 127.0.0.1, run from the repository as deployed.

It reads the repository's ``gunicorn.conf.py`` (its worker and request limits), and
serves the test database: rows a test commits (``transactional_db``) are what it
sees. One server per module and ``DEBUG`` setting; its log is checked for
tracebacks when the module ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.urls import URLPattern

from audit import checkpoints
from portal import services as portal_services
from portal.models import Agent, AgentGrant, Tenant
from tasks.models import Operation, OperationState, Task, TaskState
from tests.fault.harness import database_url
from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0


@dataclass
class Server:
    port: int
    debug: bool
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start(
    *,
    debug: bool,
    log_path: Path,
    env_extra: dict[str, str] | None = None,
    workers: int = 2,
    extra_args: tuple[str, ...] = (),
    wait_path: str = "/api/v1/",
    app: str = "config.wsgi:application",
) -> Server:
    # The signer publishes the development key's public half beside it (in a
    # deployment the worker has done so before the web's first request); without
    # it, a fresh clone's web answers the public-key route 503 until some other
    # test has signed a checkpoint.
    checkpoints.signing_key()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    env.update(
        DATABASE_URL=database_url(),
        DJANGO_DEBUG="1" if debug else "0",
        PORTAL_DEV_MODE="1",
        PORTAL_AGENT_RATE_LIMIT="1000000/min",  # the fuzz must not meet 429s only
        PORTAL_AUTH_FAILURE_LIMIT="1000000/min",  # the fuzz sends bad keys by design
        PYTHONUNBUFFERED="1",
    )
    env.update(env_extra or {})
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                app,
                "-b",
                f"127.0.0.1:{port}",
                "--workers",
                str(workers),
                "--no-control-socket",
                *extra_args,
            ],
            cwd=REPO,  # gunicorn reads ./gunicorn.conf.py from here, as deployed
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(port=port, debug=debug, process=process, log_path=log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited:\n{server.log()}")
        try:
            httpx.get(f"{server.base_url}{wait_path}", timeout=2.0)
        except httpx.TransportError:
            time.sleep(0.2)
        else:
            return server
    stop(server)
    raise RuntimeError(f"gunicorn did not answer:\n{server.log()}")


def stop(server: Server) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


def _serve(debug: bool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log_path = tmp_path_factory.mktemp("gunicorn") / "server.log"
    running = start(debug=debug, log_path=log_path)
    try:
        yield running
    finally:
        stop(running)
    # A traceback in the log is a request the server did not handle.
    assert "Traceback" not in running.log(), running.log()[-5000:]


@pytest.fixture(scope="module", params=[True, False], ids=["debug-on", "debug-off"])
def server(
    request: pytest.FixtureRequest,
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """The server with DEBUG on (as ``up`` runs it) and off (as production does)."""
    yield from _serve(bool(request.param), tmp_path_factory)


@pytest.fixture(scope="module")
def debug_server(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """DEBUG on only: where Django itself answers in HTML most (technical pages)."""
    yield from _serve(True, tmp_path_factory)


@dataclass
class World:
    """What one test's requests act on: committed, visible to the server."""

    tenant: Tenant
    agent: Agent
    secret: str
    task: Task
    operation: Operation

    @property
    def auth(self) -> str:
        return f"Bearer {self.secret}"


@pytest.fixture
def world(transactional_db: None) -> World:
    tenant = Tenant.objects.create(slug=f"fz-{uuid.uuid4().hex[:8]}", name="Fuzz")
    agent = Agent.objects.create(tenant=tenant, name="fuzz-agent")
    AgentGrant.objects.create(
        tenant=tenant, agent=agent, action="create_ticket", target="*"
    )
    secret = portal_services.agent_key_issue(agent=agent).secret
    task = Task.objects.create(
        tenant=tenant,
        state=TaskState.PENDING,
        client_task_id="fuzz-task",
        registration_hash="0" * 64,
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id="issue-1",
        object_version="1",
    )
    operation = Operation.objects.create(
        tenant=tenant,
        task=task,
        state=OperationState.RESERVED,
        idempotency_key="fuzz-op",
        action="create_ticket",
        target="ticket-desk",
        input_hash="0" * 64,
        input={},
    )
    return World(tenant, agent, secret, task, operation)


_PARAM = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")


def api_routes() -> list[str]:
    """Every route of the URL conf under /api/, as a pattern (``<uuid:task_id>``)."""
    from config.urls import urlpatterns

    return [
        "/" + str(p.pattern)
        for p in urlpatterns
        if isinstance(p, URLPattern) and str(p.pattern).startswith("api/")
    ]


def fill(route: str, world: World, *, real_ids: bool = True) -> str:
    """A concrete path for a route pattern: the world's ids, or unknown ones."""

    def value(match: re.Match[str]) -> str:
        name, converter = match["name"], match["converter"]
        if converter == "uuid":
            if not real_ids:
                return str(uuid.uuid4())
            return str(world.operation.pk if "operation" in name else world.task.pk)
        if converter == "int":
            return "1"
        if name == "tenant_slug":
            return world.tenant.slug
        return "fuzz"

    return _PARAM.sub(value, route)
