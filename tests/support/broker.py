"""RabbitMQ for the tests: the machine's broker, a private node, test queues.

The machine's broker (127.0.0.1:5672) is shared with whatever else runs here, so each
test publishes to its own exchange. The outage test stops a *private* node of its own
(its own name, port and data folder) so that stopping it disturbs no one else.

The fixtures ``amqp_url``, ``events_exchange`` and ``celery_test_queue`` are defined
here once; a conftest or test module that needs them imports them (tests/worker,
tests/gateway, tests/fault, tests/pgbouncer, tests/http).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from amqp.exceptions import NotFound
from kombu import Connection, Exchange, Queue

from tests.support.net import free_port

SHARED_URL = os.environ.get(
    "PORTAL_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"
)
_RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
# What a consumer of the portal's events declares (docs/outbox.md, "Quorum queues").
QUORUM: dict[str, Any] = {"x-queue-type": "quorum"}


def broker_reachable(url: str, timeout: float = 3.0) -> bool:
    broker = Connection(url, connect_timeout=timeout)
    try:
        broker.ensure_connection(max_retries=0)
        return True
    except Exception:  # noqa: BLE001
        return False
    finally:
        broker.release()


def ensure_shared_broker(url: str = SHARED_URL) -> str | None:
    """Reach the machine's RabbitMQ, starting it if it is down; None or why not."""
    if broker_reachable(url):
        return None
    if os.geteuid() != 0 or not shutil.which("rabbitmqctl"):
        return f"RabbitMQ at {url} is down and this user cannot start it"
    # A stopped app (stop_app) comes back with start_app; a stopped node needs -detached.
    _run(["rabbitmqctl", "start_app"], check=False, timeout=60)
    if not broker_reachable(url):
        _run(["rabbitmq-server", "-detached"], check=False, timeout=60)
        _run(
            ["rabbitmqctl", "await_startup", "--timeout", "90"],
            check=False,
            timeout=100,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if broker_reachable(url):
            return None
        time.sleep(1)
    return f"RabbitMQ at {url} is down and `rabbitmq-server -detached` did not start it"


def _run(
    command: list[str], *, check: bool = True, timeout: float = 60, env: Any = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, check=check, timeout=timeout, env=env
    )


@contextlib.contextmanager
def closed_port() -> Any:
    """A 127.0.0.1 port that refuses connections (bound, never listening)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield int(holder.getsockname()[1])


class PrivateNode:
    """A RabbitMQ node of this test run only: own name, ports and data folder.

    Started as the ``rabbitmq`` user (as the Debian service is), with the machine's
    Erlang cookie, so ``rabbitmqctl -n NAME`` controls it.
    """

    def __init__(self) -> None:
        self.name = f"portaltest{os.getpid()}x{uuid.uuid4().hex[:6]}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.base = Path(tempfile.mkdtemp(prefix="portal-rabbit-"))

    @staticmethod
    def unavailable() -> str | None:
        if os.geteuid() != 0:
            return "a private RabbitMQ node must be started as root (su rabbitmq)"
        if not (_RABBIT_BIN / "rabbitmq-server").exists():
            return "rabbitmq-server is not installed"
        return None

    def start(self, timeout: float = 90) -> None:
        (self.base / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        (self.base / "env.conf").write_text(f"NODENAME={self.name}\n")
        (self.base / "enabled_plugins").write_text("[].\n")
        shutil.chown(self.base, user="rabbitmq")
        for child in self.base.iterdir():
            shutil.chown(child, user="rabbitmq")
        variables = {
            "HOME": "/var/lib/rabbitmq",
            "RABBITMQ_CONF_ENV_FILE": self.base / "env.conf",
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_CONFIG_FILE": self.base / "rabbitmq.conf",
            "RABBITMQ_DIST_PORT": self.dist_port,
            "RABBITMQ_MNESIA_BASE": self.base / "mnesia",
            "RABBITMQ_LOG_BASE": self.base / "log",
            "RABBITMQ_PID_FILE": self.base / "pid",
            "RABBITMQ_ENABLED_PLUGINS_FILE": self.base / "enabled_plugins",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        assignments = " ".join(f"{key}='{value}'" for key, value in variables.items())
        script = (
            "cd /var/lib/rabbitmq && "
            f"{assignments} ERL_FLAGS='-kernel inet_dist_use_interface {{127,0,0,1}}' "
            f"{_RABBIT_BIN / 'rabbitmq-server'} -detached"
        )
        _run(["su", "rabbitmq", "-s", "/bin/sh", "-c", script], timeout=60)
        # -detached returns at once; the node registers and listens seconds later.
        deadline = time.monotonic() + timeout
        while not broker_reachable(self.url, timeout=1):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"private RabbitMQ {self.name} did not start: {self.log_tail()}"
                )
            time.sleep(0.5)

    def log_tail(self, lines: int = 20) -> str:
        """The end of the node's log files, for a failure message."""
        tails = []
        for log in sorted((self.base / "log").glob("*.log")):
            with contextlib.suppress(OSError):
                tails.append(
                    "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                )
        return "\n".join(tails)

    def ctl(self, *args: str, timeout: float = 60) -> str:
        result = _run(["rabbitmqctl", "-n", self.name, *args], timeout=timeout)
        return result.stdout

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        deadline = time.monotonic() + 30
        while not broker_reachable(self.url):
            if time.monotonic() > deadline:
                raise RuntimeError(f"private RabbitMQ {self.name} did not come back")
            time.sleep(0.2)

    def restart(self, timeout: float = 90) -> None:
        """Stop the whole node (its Erlang VM exits) and start it again on the same
        name, port and data folder: what a broker host's reboot does to the queues."""
        # With the pid file, ``stop`` returns only once the node's process has ended.
        self.ctl("stop", str(self.base / "pid"), timeout=timeout)
        self.start(timeout=timeout)

    def queue_types(self) -> dict[str, str]:
        """Every queue of the node: name -> type (classic, quorum)."""
        out = self.ctl("list_queues", "name", "type", "--quiet", "--no-table-headers")
        return dict(line.split("\t")[:2] for line in out.splitlines() if "\t" in line)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.ctl("stop", timeout=60)
        # Whatever still runs of this node (e.g. stopped while booting): by pid.
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if self.name.split("@")[0] in " ".join(process.info["cmdline"] or []):
                    process.kill()
        shutil.rmtree(self.base, ignore_errors=True)


@dataclass(frozen=True, kw_only=True)
class Received:
    message_id: str
    routing_key: str
    headers: dict[str, Any]
    body: dict[str, Any]
    redelivered: bool
    properties: dict[str, Any]


class EventQueue:
    """A durable quorum queue bound to an exchange with ``#``: what a consumer would
    see."""

    def __init__(self, *, url: str, exchange: str, name: str | None = None) -> None:
        self.url = url
        self.exchange = Exchange(exchange, type="topic", durable=True)
        self.name = name or f"relaytest-{uuid.uuid4().hex[:10]}"
        self.queue = Queue(
            self.name,
            self.exchange,
            routing_key="#",
            durable=True,
            queue_arguments=QUORUM,
        )

    def declare(self) -> EventQueue:
        with Connection(self.url) as broker:
            self.queue(broker.default_channel).declare()
        return self

    def drain(
        self, *, expected: int, timeout: float = 30, idle: float = 1.0
    ) -> list[Received]:
        """Take messages (acking them) until ``expected`` arrived and ``idle`` s pass
        without more, or ``timeout``; in queue order."""
        received: list[Received] = []
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        with Connection(self.url) as broker:
            bound = self.queue(broker.default_channel)
            while time.monotonic() < deadline:
                message = bound.get(no_ack=False)
                if message is None:
                    if (
                        len(received) >= expected
                        and time.monotonic() - quiet_since > idle
                    ):
                        break
                    time.sleep(0.02)
                    continue
                quiet_since = time.monotonic()
                received.append(
                    Received(
                        message_id=message.properties.get("message_id", ""),
                        routing_key=message.delivery_info["routing_key"],
                        headers=dict(message.headers or {}),
                        body=json.loads(message.body or "{}"),
                        redelivered=bool(message.delivery_info.get("redelivered")),
                        properties=dict(message.properties),
                    )
                )
                message.ack()
        return received

    def delete(self) -> None:
        with contextlib.suppress(Exception), Connection(self.url) as broker:
            self.queue(broker.default_channel).delete()


class Tap:
    """A copy of what the portal sends through RabbitMQ, as a consumer gets it.

    Events: a queue bound to the relay's topic exchange with ``#``, declared before
    anything is published. Celery jobs and nudges: Celery publishes them to the
    default exchange with the queue's name as routing key, and the default exchange
    takes no bindings, so ``peek`` reads the job queue itself before a worker runs,
    taking each message without acking and handing them all back (closing the
    channel requeues them) for the worker.
    """

    def __init__(self, *, url: str, events: str) -> None:
        self.url = url
        self.name = f"tap-{uuid.uuid4().hex[:10]}"
        self.queue = Queue(
            self.name,
            Exchange(events, type="topic", durable=True),
            routing_key="#",
            queue_arguments=QUORUM,
        )
        self.peeked: list[Any] = []

    def declare(self) -> Tap:
        with Connection(self.url) as broker:
            self.queue(broker.default_channel).declare()
        return self

    def peek(self, queue: str) -> int:
        """Copy every message now in ``queue`` and leave them there; how many."""
        taken = []
        with Connection(self.url) as broker:
            bound = Queue(queue)(broker.default_channel)
            while (message := bound.get(no_ack=False)) is not None:
                taken.append(message)
        self.peeked.extend(taken)
        return len(taken)

    def drain(self) -> list[Any]:
        """The messages peeked at, then every event now in the tap (acked)."""
        return [*self.peeked, *queued_messages(self.url, self.name)]

    def delete(self) -> None:
        with contextlib.suppress(Exception), Connection(self.url) as broker:
            self.queue(broker.default_channel).delete()


def delete_exchange(url: str, name: str) -> None:
    with contextlib.suppress(Exception), Connection(url) as broker:
        Exchange(name, type="topic")(broker.default_channel).delete()


def delete_queue(url: str, name: str) -> None:
    with contextlib.suppress(Exception), Connection(url) as broker:
        Queue(name)(broker.default_channel).delete()


def queued_messages(url: str, name: str) -> list[Any]:
    """Take every message now in queue ``name`` (acking them)."""
    taken = []
    with Connection(url) as broker:
        queue = Queue(name)(broker.default_channel)
        try:
            while (message := queue.get(no_ack=False)) is not None:
                taken.append(message)
                message.ack()
        except NotFound:  # nothing was ever sent there
            return []
    return taken


# --- Fixtures (imported by the conftests that use them) ------------------------------


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The machine's RabbitMQ, started when it is down.

    A failure, not a skip, when it cannot be reached: the broker is one of the
    services the suite needs (`.ci/run` starts it), not an optional extra.
    """
    reason = ensure_shared_broker(SHARED_URL)
    if reason is not None:
        pytest.fail(reason)
    return SHARED_URL


@pytest.fixture
def events_exchange(amqp_url: str, settings: Any) -> Iterator[str]:
    """This test's own topic exchange; the relay publishes there."""
    name = f"portal.events.test-{uuid.uuid4().hex[:10]}"
    settings.PORTAL_EVENTS_BROKER_URL = amqp_url
    settings.PORTAL_EVENTS_EXCHANGE = name
    yield name
    delete_exchange(amqp_url, name)


@pytest.fixture
def celery_test_queue(amqp_url: str) -> Iterator[str]:
    """Point the Celery app at the test broker and a queue of this test only.

    Jobs and nudges (``relay.nudge_relay``) land there, where no other worker
    listens; the queue is deleted afterwards.
    """
    from audit import relay
    from config.celery import app

    name = f"celery-test-{uuid.uuid4().hex[:10]}"
    saved = (app.conf.broker_url, app.conf.task_default_queue)
    redirect_celery(broker_url=amqp_url, queue=name)
    relay._nudge_paused_until = 0.0
    yield name
    delete_queue(amqp_url, name)
    redirect_celery(broker_url=saved[0], queue=saved[1])
    relay._nudge_paused_until = 0.0


def redirect_celery(*, broker_url: str, queue: str) -> None:
    """Re-point the Celery app; its cached producers and queues are rebuilt lazily."""
    from config.celery import app

    conf: Any = app.conf
    conf.broker_url = broker_url
    conf.task_default_queue = queue
    app.__dict__["_pool"] = None  # celery's private connection pool cache
    app.__dict__.pop("amqp", None)
