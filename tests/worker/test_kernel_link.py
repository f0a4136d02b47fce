"""The relay ↔ RabbitMQ link cut by the kernel (issue 25, R15).

A private RabbitMQ node runs on a machine of its own: a network namespace reached
over a veth pair (tests/support/netns.py), listening on its end. The relay holds an
OPEN connection to it when every packet in and out of the broker's machine starts
being dropped (no FIN, no RST). The wave published into the silence ends within the
confirm timeout (``PORTAL_OUTBOX_CONFIRM_TIMEOUT_S``) + 1 s with its rows failed,
not ``sent``, closing the publisher included; a new run cannot connect and says the
broker is down within the same bound; healed, every row is delivered: nothing lost,
any repeat under the same message id (at least once, docs/outbox.md).

tests/worker/test_network_faults.py has the proxy's cases on the machine's broker.
This one starts a RabbitMQ node of its own (about 20 s), so it runs when
``PORTAL_KERNEL_BROKER=1`` asks for it: ``.ci/run`` sets it; a developer's quick run
leaves it out.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from audit import relay
from audit.broker import broker_publisher
from audit.models import Outbox, OutboxState
from portal.models import Tenant
from tests.support import netns
from tests.support.broker import EventQueue

from .conftest import append_events, timed_drain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("PORTAL_KERNEL_BROKER") != "1",
        reason="asked for by PORTAL_KERNEL_BROKER=1 (.ci/run sets it): its private"
        " broker node takes about 20 s to start, too long for a developer's quick run",
    ),
]

TIMEOUT_S = 2.0
PORT = 5672  # the namespace's own
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


@pytest.fixture(scope="module")
def link() -> Iterator[netns.Link]:
    netns.require()
    if not shutil.which("rabbitmq-server"):
        pytest.fail("rabbitmq-server is not installed (.ci/run installs it)")
    with netns.remote_link() as made:
        yield made


@pytest.fixture(scope="module")
def remote_broker(link: netns.Link) -> Iterator[str]:
    """A RabbitMQ node of its own inside the namespace; its AMQP URL."""
    folder = tempfile.mkdtemp(prefix="portal-nf-rmq-")
    with open(f"{folder}/rabbitmq.conf", "w") as config:
        config.write(
            f"listeners.tcp.default = {link.inner}:{PORT}\n"
            "loopback_users = none\n"  # guest from this side of the pair
        )
    with open(f"{folder}/enabled_plugins", "w") as plugins:
        plugins.write("[].\n")
    env = {
        "HOME": folder,  # its own Erlang cookie
        "RABBITMQ_NODENAME": "portal-nf@localhost",
        "RABBITMQ_MNESIA_BASE": f"{folder}/mnesia",
        "RABBITMQ_LOG_BASE": f"{folder}/log",
        "RABBITMQ_CONFIG_FILE": f"{folder}/rabbitmq.conf",
        "RABBITMQ_ENABLED_PLUGINS_FILE": f"{folder}/enabled_plugins",
        "RABBITMQ_PID_FILE": f"{folder}/pid",
    }
    with open(f"{folder}/server.log", "wb") as log:
        server = subprocess.Popen(
            link.command("env", *(f"{k}={v}" for k, v in env.items()), RABBITMQ_SERVER),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection((link.inner, PORT), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    with open(f"{folder}/server.log") as failed:
                        raise RuntimeError(failed.read()[-3000:]) from None
                time.sleep(0.3)
        yield f"amqp://guest:guest@{link.inner}:{PORT}//"
    finally:
        link.heal()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        # epmd and the node's children go with the namespace (netns.remote_link).
        shutil.rmtree(folder, ignore_errors=True)


def test_a_kernel_partition_of_the_open_broker_link_is_bounded_and_loses_nothing(
    tenant: Tenant, link: netns.Link, remote_broker: str, settings: Any
) -> None:
    settings.PORTAL_OUTBOX_CONFIRM_TIMEOUT_S = TIMEOUT_S
    settings.PORTAL_OUTBOX_BACKOFF_BASE_S = 0.0  # a failed row is due again at once
    settings.PORTAL_EVENTS_BROKER_URL = remote_broker
    queue = EventQueue(
        url=remote_broker, exchange=settings.PORTAL_EVENTS_EXCHANGE
    ).declare()

    # Given: the relay's connection is open and has delivered a first wave.
    with broker_publisher() as publisher:
        append_events(tenant=tenant, task_ids=[None] * 5)
        opened = relay.outbox_relay_drain(publisher=publisher)
        assert opened.sent == 5, opened
        # When: the link goes silent under it and the next wave is published.
        append_events(tenant=tenant, task_ids=[None] * 10)
        link.cut()
        began = time.monotonic()
        cut = relay.outbox_relay_once(publisher=publisher)
    took = time.monotonic() - began  # the publisher's close included

    # Then: one bounded wait; the rows failed, not sent.
    assert (cut.sent, cut.failed) == (0, 10), cut
    assert took <= TIMEOUT_S + 1, took
    print(f"kernel cut of the open broker link: {cut.failed} failed after {took:.2f} s")

    # A new run cannot connect: the broker is down within the bound; rows wait.
    report, took_down = timed_drain()
    assert report.broker_down and report.sent == 0, report
    assert took_down <= TIMEOUT_S + 1, took_down
    assert Outbox.objects.filter(tenant=tenant, state=OutboxState.PENDING).count() == 10

    # Healed: every row delivered, under its own message id.
    link.heal()
    healed, _ = timed_drain()
    assert healed.sent == 10, healed
    rows = set(Outbox.objects.filter(tenant=tenant).values_list("key", flat=True))
    assert set(
        Outbox.objects.filter(tenant=tenant).values_list("state", flat=True)
    ) == {OutboxState.SENT}
    received = queue.drain(expected=len(rows), timeout=30)
    seen = Counter(message.message_id for message in received)
    assert set(seen) == rows and all(n <= 2 for n in seen.values()), seen
    print(f"healed: {len(rows)} rows, {sum(seen.values())} messages at the queue")
